# Shared by the launch scripts (sourced): DRY_RUN=1 prints each command,
# shell-quoted, instead of running it.

# Prints words as one line that a shell reads back as the same words:
# plain words as they are, others in single (or double) quotes.
show() {
  local out=() word
  for word in "$@"; do
    if [[ "${word}" =~ ^[A-Za-z0-9_./:=@%+,-][A-Za-z0-9_./:=@%+,~-]*$ ]]; then
      out+=("${word}")
    elif [[ "${word}" != *"'"* ]]; then
      out+=("'${word}'")
    elif [[ "${word}" =~ ^[^\"\$\`\\!]+$ ]]; then
      out+=("\"${word}\"")
    else
      out+=("${word@Q}")
    fi
  done
  echo "${out[*]}"
}

# Runs a command, or prints it when DRY_RUN=1.
run() {
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    show "$@"
  else
    "$@"
  fi
}
