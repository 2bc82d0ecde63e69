"""The training runtime behind `eqattn train | evaluate | retrieve`, as a library: the
configurations, one [`Trainer`][eqattn.train.Trainer] over the tasks (each an
[`AbstractTask`][eqattn.train.AbstractTask]: the digits, text, graphs), checkpoints and metrics, and
evaluation at test-time solver budgets.

```python
from eqattn import train

metrics = train.train(train.ModelConfig(), train.TrainConfig(), "runs/digits")
model, config, header = train.load_model("runs/digits")
```
"""

from .._checkpoint import BEST as BEST, CHECKPOINT as CHECKPOINT
from .._errors import ConfigError as ConfigError, Interrupted as Interrupted, RunError as RunError
from ._api import (
    LoadedModel as LoadedModel,
    configs as configs,
    evaluate as evaluate,
    load_model as load_model,
    text_configs as text_configs,
    train as train,
)
from ._config import (
    ADJOINTS as ADJOINTS,
    SOLVERS as SOLVERS,
    ModelConfig as ModelConfig,
    TrainConfig as TrainConfig,
)
from ._digits import DigitsTask as DigitsTask
from ._graphs import GraphTask as GraphTask
from ._retrieve import retrieve as retrieve
from ._step import optimizer_of as optimizer_of
from ._task import AbstractTask as AbstractTask, Headline as Headline
from ._tasks import (
    build_model as build_model,
    count_params as count_params,
    explicit_shape as explicit_shape,
    task_of as task_of,
    tasks as tasks,
)
from ._text import TextTask as TextTask
from ._trainer import Trainer as Trainer
