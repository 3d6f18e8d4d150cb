"""The two numbers every layer of gdn_graphs agrees on."""

# A slot index that names no slot: a kernel never reads or writes it. A row whose read slot is
# NO_SLOT starts from a zero state, a row whose write slot is NO_SLOT stores nothing, and a padded
# row (both NO_SLOT) writes zeros to its output.
NO_SLOT = -1

# Prefill chunk length, aligned to absolute positions in the sequence. Block sizes are multiples of
# it, so every block boundary is a chunk boundary and a warm run repeats the cold run's arithmetic.
CHUNK = 64
