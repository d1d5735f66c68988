#!/usr/bin/env bash
# Writes a man page (roff) for one of our binaries from its --help output, so the page
# lists exactly the flags the binary accepts, in its sections, with their defaults.
#   ci/help2man.sh BINARY NAME VERSION > NAME.1
set -euo pipefail
bin=${1:?binary} name=${2:?name} version=${3:?version}
help=$("$bin" --help)
esc() { sed -e 's/\\/\\\\/g' -e 's/-/\\-/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }
summary=$(awk 'NR > 2 && /^$/ {exit} NR > 2 {print}' <<<"$help")
echo ".TH $(tr a-z A-Z <<<"$name") 1 \"\" \"pegaflow $version\" \"User Commands\""
echo ".SH NAME"
echo "$name \\- $(head -n 1 <<<"$summary" | sed 's/:.*//' | esc)"
echo ".SH SYNOPSIS"
echo ".B $name"
echo "[\\fIflags\\fR]"
echo ".SH DESCRIPTION"
esc <<<"$summary"
echo ".SH OPTIONS"
awk 'NR > 2 && /^$/ {body = 1; next} body' <<<"$help" | while IFS= read -r line; do
  case "$line" in
    "  --"*)
      left=$(sed -E 's/^  (--[^ ]+( <[^>]+>)?).*/\1/' <<<"$line")
      text=$(sed -E 's/^  --[^ ]+( <[^>]+>)? +//' <<<"$line")
      flag=${left%% *}
      meta=${left#"$flag"}
      echo ".TP"
      if [ -n "$meta" ]; then
        echo "\\fB$(esc <<<"$flag")\\fR \\fI$(esc <<<"${meta# }")\\fR"
      else
        echo "\\fB$(esc <<<"$flag")\\fR"
      fi
      esc <<<"$text" ;;
    "Flags:") ;;
    *:) echo ".SS $(esc <<<"${line%:}")" ;;
    "") ;;
    *) esc <<<"$line" ;;
  esac
done
echo ".SH FILES"
echo ".TP"
echo "/etc/default/$name"
echo "Flags for the systemd unit $name.service (variable PEGAFLOW_$(tr a-z- A-Z_ <<<"${name#pegaflow-}")_ARGS)."
echo ".SH SEE ALSO"
echo "/usr/share/doc/pegaflow/"
