"""Set a bundled model's manifest "note" (what the model is for, shown in every job summary and report).

    python scripts/set_manifest_note.py samples/models/X/manifest.json "Road-distress ... " "trained only on ..."

The note is the arguments after the manifest, joined as they are (a long note fits in several shell lines).
"""

import json
import sys


def main(argv: list[str]) -> int:
    path, *parts = argv
    note = "".join(parts)
    with open(path) as handle:
        data = json.load(handle)
    data["note"] = note
    with open(path, "w") as handle:
        handle.write(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
