"""The chat demo's prompts (its bad flags and folders: bad_inputs_test.py)."""

from seed_jax import chat
from seed_jax import hf
from seed_jax import rollout
from seed_jax import sampler
from seed_jax import testing
from seed_jax import tokenizer as tokenizer_lib


def test_chat_templates_that_print_a_date_get_the_rollouts_one(
    monkeypatch, capsys):
  tok = tokenizer_lib.train_tokenizer(["a b c d e f g h"] * 5, vocab_size=300)
  # As Llama 3.2/3.3 templates do: today's date unless date_string is given.
  tok.chat_template = (
      "{% if date_string is not defined %}"
      "{% set date_string = strftime_now('%d %b %Y') %}{% endif %}"
      "date: {{ date_string }}|"
      "{% for m in messages %}{{ m['content'] }}{% endfor %}")
  config = testing.tiny_config(vocab_size=len(tok))
  sent = []

  def generate_text(params, config, tokenizer, prompts, **kw):
    del params, config, tokenizer, kw
    sent.extend(prompts)
    return ["ok"] * len(prompts)

  monkeypatch.setattr(hf, "load_tokenizer", lambda path: tok)
  monkeypatch.setattr(hf, "load_gguf", lambda: (config, None))
  monkeypatch.setattr(sampler, "generate_text", generate_text)
  chat.main(["a b", "c d"])
  # The prompts rollouts encode: the same text whatever the day.
  assert sent == [f"date: {rollout.CHAT_DATE_STRING}|a b",
                  f"date: {rollout.CHAT_DATE_STRING}|c d"], sent
  assert ">>> a b\nok" in capsys.readouterr().out
