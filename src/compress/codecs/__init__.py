"""One module per codec; this package only re-exports the codec classes."""

from .bf16 import BF16
from .dgc import DGC
from .efsignsgd import EFSignSGD
from .eightbit import EightBit
from .fp16 import FP16
from .natural import Natural
from .none import Identity
from .onebit import OneBit
from .powersgd import PowerSGD
from .qsgd import QSGD
from .randomk import RandomK
from .signsgd import SignSGD
from .terngrad import TernGrad
from .threshold import Threshold
from .topk import TopK

__all__ = [
    "BF16",
    "DGC",
    "EFSignSGD",
    "EightBit",
    "FP16",
    "Identity",
    "Natural",
    "OneBit",
    "PowerSGD",
    "QSGD",
    "RandomK",
    "SignSGD",
    "TernGrad",
    "Threshold",
    "TopK",
]
