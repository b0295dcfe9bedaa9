#!/usr/bin/env bash
# tests/gpu/udev-stand-in.sh DIR: lets cuFile register files under DIR in a container that has no
# udev database (/run/udev), as the lent GPU machines are. cuFileHandleRegister asks udev for the
# attributes of the block device behind the file (ID_FS_USAGE, ID_FS_TYPE) and, without them,
# registers nothing: every `buffer load --gds always` there fails with CU_FILE_HANDLE_NOT_REGISTERED
# ("udev property not found: ID_FS_USAGE" in cufile.log). On a host, udevd writes these entries.
#
# Writes /run/udev/data/bMAJOR:MINOR for DIR's file system with what udevd would say of it, only
# when /run/udev does not exist (never over a real database), and only as root. Prints what it did.
set -euo pipefail
DIR=${1:?usage: udev-stand-in.sh DIR}
if [ -e /run/udev ]; then
  echo "udev-stand-in: /run/udev exists; nothing written"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "udev-stand-in: needs root to write /run/udev" >&2; exit 1; }
DEV=$(python3 -c 'import os, sys; s = os.stat(sys.argv[1]); print(f"{os.major(s.st_dev)}:{os.minor(s.st_dev)}")' "$DIR")
TYPE=$(stat -f -c %T "$DIR")
[ "$TYPE" = ext2/ext3 ] && TYPE=ext4
mkdir -p /run/udev/data
printf 'E:ID_FS_USAGE=filesystem\nE:ID_FS_TYPE=%s\n' "$TYPE" >"/run/udev/data/b$DEV"
echo "udev-stand-in: wrote /run/udev/data/b$DEV (ID_FS_USAGE=filesystem, ID_FS_TYPE=$TYPE) for $DIR"
