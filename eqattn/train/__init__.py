"""The generic training runtime: one [`Trainer`][eqattn.train.Trainer] for any task (an
[`AbstractTask`][eqattn.train.AbstractTask] with its [`Config`][eqattn.train.Config]): the
loop, the schedule, checkpoints, progress, resume, the run directory's lock, timing, and
evaluation at test-time solver budgets. It knows no task: the tasks (`eqattn.digits`,
`eqattn.text`, `eqattn.graphs`) are built on it.

```python
from eqattn import graphs, train

task = graphs.GraphTask(graphs.GraphConfig(epochs=1))
metrics = train.train(task, "runs/graphs/deq")
model = graphs.load_model("runs/graphs/deq")
```

`__all__` is the public API. The other names below are the interface the tasks are written with
(configuration checks, the step's update, evaluation's sweep and progress bar, files written
atomically): import them from here, never from this package's modules.
"""

from .._errors import ConfigError as ConfigError, Interrupted as Interrupted, RunError as RunError
from ._api import (
    LoadedModel as LoadedModel,
    config_of as config_of,
    evaluate as evaluate,
    initial_model as initial_model,
    load_model as load_model,
    resumable as resumable,
    resume as resume,
    train as train,
)
from ._checkpoint import BEST as BEST, CHECKPOINT as CHECKPOINT, read_header as read_header
from ._config import (
    Config as Config,
    TransformerConfig as TransformerConfig,
    at_least as at_least,
    field_metadata as field_metadata,
    in_range as in_range,
    non_negative as non_negative,
    setting as setting,
)
from ._evaluation import (
    budget_sweep as budget_sweep,
    progress_bar as progress_bar,
    solve_cells as solve_cells,
    sweep_note as sweep_note,
)
from ._files import atomic_write as atomic_write, writable_dir as writable_dir
from ._models import (
    count_params as count_params,
    explicit_shape as explicit_shape,
    with_shape as with_shape,
)
from ._placement import on_host as on_host
from ._reasoning import (
    ReasoningStats as ReasoningStats,
    Run as Run,
    mean_parts as mean_parts,
    partial_solve as partial_solve,
    reasoning_fit as reasoning_fit,
    reasoning_loss as reasoning_loss,
    reasoning_paths as reasoning_paths,
    reasoning_score as reasoning_score,
    reasoning_score_steps as reasoning_score_steps,
    reasoning_step as reasoning_step,
    residual_from_zeros as residual_from_zeros,
)
from ._reasoning_task import ReasoningTask as ReasoningTask
from ._step import (
    apply as apply,
    optimizer_of as optimizer_of,
    penalties as penalties,
    probed as probed,
)
from ._task import (
    AbstractTask as AbstractTask,
    Headline as Headline,
    read_metrics as read_metrics,
    run_line as run_line,
)
from ._trainer import Trainer as Trainer

__all__ = [
    "AbstractTask",
    "BEST",
    "CHECKPOINT",
    "Config",
    "ConfigError",
    "Headline",
    "Interrupted",
    "LoadedModel",
    "ReasoningTask",
    "RunError",
    "Trainer",
    "TransformerConfig",
    "evaluate",
    "initial_model",
    "load_model",
    "optimizer_of",
    "resume",
    "train",
]
