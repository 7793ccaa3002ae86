"""lopper.distillation_loss: the trainer's distillation term in a user's own PyTorch loop, against
numpy written out and torch.nn.functional.kl_div (value and gradient), and its bad arguments."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import lopper


def numpy_kl(s, t, T):
    """T^2 * mean over rows of sum_c p_t (log p_t - log p_s), in float64."""
    s, t = s.astype(np.float64) / T, t.astype(np.float64) / T
    ls = s - s.max(1, keepdims=True)
    ls = ls - np.log(np.exp(ls).sum(1, keepdims=True))
    lt = t - t.max(1, keepdims=True)
    lt = lt - np.log(np.exp(lt).sum(1, keepdims=True))
    return float((np.exp(lt) * (lt - ls)).sum(1).mean() * T * T)


@pytest.mark.parametrize("T", [1.0, 2.0, 4.0])
def test_equals_numpy_for_classifier_rows(T):
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(8, 10, generator=g) * 3, torch.randn(8, 10, generator=g) * 3
    got = lopper.distillation_loss(s, t, temperature=T)
    assert got.dim() == 0
    assert got.item() == pytest.approx(numpy_kl(s.numpy(), t.numpy(), T), rel=1e-5)


def test_tokens_with_padding_left_out_and_gradient_equals_kl_div():
    g = torch.Generator().manual_seed(1)
    s = torch.randn(2, 5, 17, generator=g, requires_grad=True)
    t = torch.randn(2, 5, 17, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    T = 2.0
    got = lopper.distillation_loss(s, t, temperature=T, mask=mask)
    keep = mask.reshape(-1).bool()
    rows_s, rows_t = s.detach().reshape(-1, 17)[keep], t.reshape(-1, 17)[keep]
    assert got.item() == pytest.approx(numpy_kl(rows_s.numpy(), rows_t.numpy(), T), rel=1e-5)
    got.backward()
    s2 = s.detach().clone().requires_grad_(True)
    ref = F.kl_div(F.log_softmax(s2.reshape(-1, 17)[keep] / T, 1), F.log_softmax(rows_t / T, 1), log_target=True,
                   reduction="batchmean") * T * T
    ref.backward()
    assert ref.item() == pytest.approx(got.item(), rel=1e-5)
    torch.testing.assert_close(s.grad, s2.grad, rtol=1e-5, atol=1e-7)
    assert s.grad.reshape(-1, 17)[~keep].abs().max().item() == 0  # padding takes no gradient


def test_a_training_loop_learns_the_teacher():
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)).eval()
    student = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 5))
    opt = torch.optim.Adam(student.parameters(), lr=1e-2)
    x = torch.randn(256, 16)
    with torch.no_grad():
        t = teacher(x)
    first = None
    for _ in range(100):
        loss = lopper.distillation_loss(student(x), t, temperature=2.0)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first


def test_bad_arguments():
    s = torch.randn(4, 3)
    with pytest.raises(ValueError, match=r"\[distill\] teacher_logits \[4, 4\] must have the shape of student_logits"):
        lopper.distillation_loss(s, torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"^\[train\] temperature must be > 0, got 0$"):
        lopper.distillation_loss(s, s, temperature=0.0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        lopper.distillation_loss(s, s, temperature=float("nan"))
    with pytest.raises(ValueError, match=r"mask \[3\] must have the logits' leading shape \[4\]"):
        lopper.distillation_loss(s, s, mask=torch.ones(3))
    with pytest.raises(ValueError, match="must be floating point"):
        lopper.distillation_loss(torch.ones(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="student_logits must be a torch.Tensor, got list"):
        lopper.distillation_loss([[1.0]], s)
    with pytest.raises(TypeError, match="mask must be a torch.Tensor"):
        lopper.distillation_loss(s, s, mask=[1, 1, 1, 1])
    # Nothing counted: 0, still differentiable.
    z = lopper.distillation_loss(s.requires_grad_(True), s.detach(), mask=torch.zeros(4))
    assert z.item() == 0.0
    z.backward()
