"""A byte-level BPE tokenizer trained on the project's own text, for demo policies.

Pretrained models bring their tokenizer (`hf.load_tokenizer`); the demo policy
is trained from scratch, so it gets a small vocabulary fitted to the built-in
environments' prompts, responses and analyses. The result is a transformers
`PreTrainedTokenizerFast` with a chat template, so every code path treats it
like a Hugging Face tokenizer.
"""

from __future__ import annotations

from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD, EOS, USER, ASSISTANT = "<pad>", "<eos>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, EOS, USER, ASSISTANT)
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% else %}<|assistant|>{{ m['content'] }}<eos>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def train_tokenizer(texts: Iterable[str], *, vocab_size: int = 2048,
                    min_frequency: int = 2) -> PreTrainedTokenizerFast:
  """Fits a byte-level BPE to `texts`.

  Args:
    texts: the corpus (prompts, responses, analyses).
    vocab_size: target vocabulary size, special tokens included.
    min_frequency: minimum pair count for a merge.

  Returns:
    A tokenizer with pad id 0, eos id 1 and a user/assistant chat template.
  """
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
      vocab_size=vocab_size, min_frequency=min_frequency,
      special_tokens=list(SPECIAL_TOKENS),
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
      show_progress=False)
  tok.train_from_iterator(texts, trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD,
                                 eos_token=EOS)
  fast.add_special_tokens({"additional_special_tokens": [USER, ASSISTANT]})
  fast.chat_template = CHAT_TEMPLATE
  return fast
