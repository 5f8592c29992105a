"""`python -m fleetplan` is the `fleetplan` command."""

from fleetplan.api.cli import main

if __name__ == "__main__":
    main(prog_name="fleetplan")
