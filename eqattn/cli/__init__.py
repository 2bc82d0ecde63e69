"""The `eqattn` command (`eqattn train | evaluate | generate | retrieve | info`) and the functions behind it,
for use from Python or a notebook."""

from ._evaluate import evaluate as evaluate, load_model as load_model
from ._info import info as info
from ._main import main as main
from ._models import ModelConfig as ModelConfig
from ._retrieve import retrieve as retrieve
from ._step import TrainConfig as TrainConfig, text_configs as text_configs
from ._train import train as train
