"""The small models the adapter's tests train (written here, no
torchvision): an MLP; a CNN with BatchNorm and in-place ReLU; a transformer
block with dropout, layer norm and attention; a language model of such
blocks whose head's weight is its embedding's. Each build(seed) returns
(model, optimizer, batches) where batches(i) is iteration i's (x, y)."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, width=128, depth=8):
        super().__init__()
        layers = [nn.Linear(64, width), nn.ReLU()]
        for _ in range(depth - 2):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 10))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self, ch=8, depth=16):
        super().__init__()
        self.stem = nn.Conv2d(3, ch, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(ch, ch, 3, padding=1) for _ in range(depth))
        self.bns = nn.ModuleList(nn.BatchNorm2d(ch) for _ in range(depth))
        self.fc = nn.Linear(ch * 4 * 4, 10)

    def forward(self, x):
        x = self.stem(x)
        for conv, bn in zip(self.convs, self.bns):
            x = F.relu(bn(conv(x)), inplace=True)
        x = F.adaptive_avg_pool2d(x, 4)
        return self.fc(x.flatten(1))


class Block(nn.Module):
    """Pre-norm transformer block: attention and an MLP, with dropout."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (d // h) ** -0.5
        att = self.drop(att.softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class Transformer(nn.Module):
    def __init__(self, d=64, blocks=3):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(d) for _ in range(blocks)))
        self.head = nn.Linear(d, 10)

    def forward(self, x):
        return self.head(self.blocks(x).mean(dim=1))


class TiedLM(nn.Module):
    """A language model whose head's weight is its embedding's (tied, as
    GPT-2's): that weight's gradient is the sum of the head's part, made at
    the start of the backward, and the embedding's, made at its end.
    Returns the logits as (batch, vocabulary, position), as cross_entropy
    takes them with the next tokens as (batch, position)."""

    def __init__(self, vocab=2048, d=256, blocks=3):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(*(Block(d) for _ in range(blocks)))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids):
        return self.head(self.blocks(self.tok(ids))).transpose(1, 2)


def build(name, seed=0, small_batch_at=None):
    """Model, optimizer and batches; small_batch_at: the iteration (1-based)
    from which the batch is smaller (a last, short batch)."""
    torch.manual_seed(seed)
    if name == "mlp":
        model, shape, n = MLP(), (64,), 512
    elif name == "cnn":
        model, shape, n = CNN(), (3, 16, 16), 16
    elif name == "transformer":
        model, shape, n = Transformer(), (32, 64), 8
    elif name == "tied":
        model, shape, n = TiedLM(), None, 2
    else:
        raise ValueError(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(seed + 1)
    if shape is None:  # tokens: each position's next one is its target
        ids = [torch.randint(0, model.tok.num_embeddings, (n, 33), generator=g)
               for _ in range(16)]
        data = [(t[:, :-1].clone(), t[:, 1:].clone()) for t in ids]
    else:
        data = [(torch.randn((n,) + shape, generator=g), torch.randint(0, 10, (n,), generator=g))
                for _ in range(16)]

    def batches(i):
        x, y = data[i % len(data)]
        if small_batch_at is not None and i + 1 >= small_batch_at:
            x, y = x[: n // 2].clone(), y[: n // 2].clone()
        return x, y

    return model, opt, batches


def train_step(model, opt, x, y, set_to_none=False):
    """One iteration: the loss and every gradient, as bytes (copied out by
    numpy, so that the step leaves no tensor of its own behind).
    set_to_none: the gradients go at the step's end (zero_grad(
    set_to_none=True), torch 2's default) and are made anew by the next."""
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    grads = [p.grad.detach().numpy().tobytes() for p in model.parameters()]
    opt.step()
    opt.zero_grad(set_to_none=set_to_none)
    return loss.detach().numpy().tobytes(), grads
