"""A fixed text of code and prose (~320 tokens) that fidelity measurements decode teacher-forced:
top-1 agreement of a weight format with fp32 (scripts/quant_report.py, the QDQ test)."""

EVAL_TEXT = '''import heapq
from dataclasses import dataclass, field


@dataclass(order=True)
class Task:
    priority: int
    name: str = field(compare=False)


class Scheduler:
    """Runs tasks by priority; lower numbers run first."""

    def __init__(self) -> None:
        self._queue: list[Task] = []

    def add(self, name: str, priority: int = 10) -> None:
        heapq.heappush(self._queue, Task(priority, name))

    def run(self) -> list[str]:
        done = []
        while self._queue:
            done.append(heapq.heappop(self._queue).name)
        return done


Memory bandwidth, not arithmetic, limits how fast a language model decodes one stream of text on a
laptop or a phone: every generated token reads all of the weights once. Speculative decoding lets a
small draft model guess several tokens and the large model check them in a single pass, so the
weights are read once for several tokens instead of once per token. The output does not change:
rejection sampling keeps exactly the distribution of the large model, and greedy decoding gives the
same tokens. What changes is how many passes the large model needs, and therefore how many bytes
cross the memory bus for each token the user sees.
'''
