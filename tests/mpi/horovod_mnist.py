"""A Horovod training script with only its import changed (``import horovod.torch as hvd``).

An MNIST-shaped run on synthetic data: a small convolutional model, ``DistributedOptimizer``,
``broadcast_parameters``/``broadcast_optimizer_state``, each rank on its shard of the data, and
the test metric averaged with ``hvd.allreduce``. ``mpiexec -n 4 python horovod_mnist.py`` runs it;
tests/mpi/mpi_horovod.py runs it inside its ranks and checks the parameters agree.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import collectives.torch as hvd

hvd.init()
torch.manual_seed(hvd.rank())  # different initial weights: broadcast_parameters must fix them
torch.set_num_threads(1)

# synthetic "MNIST": 8x8 images of 10 classes, the label written into the pixels
g = torch.Generator().manual_seed(0)
labels = torch.randint(0, 10, (256,), generator=g)
images = torch.randn(256, 1, 8, 8, generator=g) * 0.1
images[torch.arange(256), 0, labels % 8, labels // 8] += 1.0
shard = slice(hvd.rank(), None, hvd.size())  # Horovod's DistributedSampler, by hand
train_x, train_y = images[shard], labels[shard]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.none)

for epoch in range(2):
    for i in range(0, len(train_x), 16):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(train_x[i:i + 16]), train_y[i:i + 16])
        loss.backward()
        optimizer.step()

with torch.no_grad():
    accuracy = (model(train_x).argmax(1) == train_y).float().mean()
test_accuracy = hvd.allreduce(accuracy, name="avg_accuracy")  # Horovod's metric average
if hvd.rank() == 0:
    print(f"accuracy {test_accuracy.item():.3f}")
