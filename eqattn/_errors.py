"""The errors eqattn raises for its users, each naming the Python parameter at fault: the graph
floor's `GraphError`, and the training runtime's and the tasks' (the `eqattn` command prints
each as one line naming its option: a `ConfigError` as a usage error, exit status 2; a
`RunError` with exit status 1; an `Interrupted` run with exit status 130)."""


class GraphError(ValueError):
    """A graph, or an argument that goes with it, that eqattn refuses: the message names the
    argument, and the shapes or the values at fault, in one line.

    **Example:**

    ```python
    import numpy as np, eqattn

    try:
        eqattn.Graph(np.array([0, 1]), np.array([1, 5]), num_nodes=3).check()
    except eqattn.GraphError as error:  # also a ValueError
        assert str(error).startswith("`receivers` must be nodes in 0 .. 2")
    ```
    """


class ConfigError(ValueError):
    """A bad setting: an option's value, or options that do not go together.

    **Example:**

    ```python
    from eqattn import digits, train

    try:
        digits.DigitsConfig(lr=-1.0)
    except train.ConfigError as error:  # also a ValueError, naming the parameter
        assert str(error) == "`lr` must be finite and > 0; got -1.0"
    ```
    """


class RunError(RuntimeError):
    """A run that cannot go on: a missing or corrupt checkpoint, an unwritable directory, a loss
    that turned NaN, a corpus that changed since the checkpoint was trained.

    **Example:**

    ```python
    from eqattn import graphs, train

    try:
        graphs.load_model("no/such/run")
    except train.RunError as error:
        assert str(error).startswith("checkpoint not found")
    ```
    """


class Interrupted(KeyboardInterrupt):
    """Training stopped by Ctrl-C after saving the model as it stood (the message says where,
    and how to resume).

    **Example:**

    ```python
    from eqattn import train

    assert issubclass(train.Interrupted, KeyboardInterrupt)  # Ctrl-C, with the run saved
    ```
    """
