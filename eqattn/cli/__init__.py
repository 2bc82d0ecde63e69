"""The `eqattn` command (`eqattn train | evaluate | generate | retrieve | info`): the last floor,
which parses, calls the library, prints and sets the exit status."""

from ._main import main as main, run as run
