# Placeholder: the fake runtime's and fakecuda-smi's rules.
