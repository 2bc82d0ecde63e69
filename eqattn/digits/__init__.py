r"""The digits task: the handwritten digits that ship with scikit-learn (1797 images of 8 x 8
pixels, no download) as token sequences, classified by a DEQ transformer or its explicit twin
(`eqattn train --task digits`); and Hopfield retrieval of digits from corrupted queries.

`load_digits()` returns a fixed, stratified train/test split with pixels scaled to [0, 1];
`tokenize(images, "rows" | "patches")` turns `[N, 8, 8]` images into `[N, tokens, features]`.

```python
from eqattn import digits, train

metrics = train.train(digits.DigitsTask(digits.DigitsConfig(epochs=2)), "runs/digits/deq")
model = digits.load_model("runs/digits/deq")
```
"""

from ..train import ConfigError as ConfigError, RunError as RunError
from ._config import DigitsConfig as DigitsConfig
from ._data import Digits as Digits, load_digits as load_digits, tokenize as tokenize
from ._retrieve import retrieve as retrieve
from ._task import DigitsTask as DigitsTask, load_model as load_model
