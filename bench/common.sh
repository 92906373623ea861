# Shell helpers the bench scripts source (`source "$(dirname "$0")/common.sh"`).

# The median of the numbers on stdin, one per line (the mean of the middle two for an even count).
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
