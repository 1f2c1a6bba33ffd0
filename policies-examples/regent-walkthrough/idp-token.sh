#!/usr/bin/env sh
# The walkthrough's test IdP: prints an id_token for a rep or a manager.
#
#   ./idp-token.sh rep       # alice@bank, role support_agent
#   ./idp-token.sh manager   # bob@bank, role manager
#   ./idp-token.sh SUB ROLE  # anyone
#
# Uses `mock-gate` from PATH (or $MOCK_GATE) and this directory's gate.yaml.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
gate=${MOCK_GATE:-mock-gate}
case "${1:-}" in
  rep) set -- alice@bank support_agent ;;
  manager) set -- bob@bank manager ;;
esac
if [ $# -ne 2 ]; then
  echo "usage: $0 rep|manager|SUB ROLE" >&2
  exit 2
fi
exec "$gate" idp-token --config "$here/gate.yaml" --sub "$1" --role "$2"
