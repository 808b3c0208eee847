"""module_attributes: a fused layer reads its parameters, buffers and children past nn.Module.__getattr__, and must
read what getattr reads in every case where the two could differ (parametrizations, weight_norm, properties, swapped
or deleted Parameters). CPU only: the fused modules run eager's composition here, through the same reads."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion._module_state import module_attributes

BN_NAMES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


class Double(nn.Module):
    def forward(self, w):
        return 2 * w


class ConvWithWeightProperty(nn.Conv2d):
    """A subclass whose `weight` is a property over another Parameter: the class's name shadows any dict entry."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.base = nn.Parameter(self._parameters.pop("weight").detach().clone())

    @property
    def weight(self):
        return self.base * 3


def assert_reads_as_getattr(module, names):
    values = module_attributes(module, names)
    assert len(values) == len(names)
    for name, value in zip(names, values):
        expected = getattr(module, name)
        if isinstance(expected, torch.Tensor) and not isinstance(expected, nn.Parameter):
            # a computed tensor (parametrization, property) is a fresh object each read: compare the values
            torch.testing.assert_close(value, expected, msg=name)
        else:
            assert value is expected, name


@pytest.mark.parametrize("bn_kwargs", [dict(), dict(affine=False), dict(track_running_stats=False)])
def test_reads_a_batch_norms_parameters_and_buffers_as_getattr_does(bn_kwargs):
    assert_reads_as_getattr(nn.BatchNorm2d(4, **bn_kwargs), BN_NAMES)


def test_reads_a_child_and_a_module_kept_in_dict_as_getattr_does():
    conv = tcf.Conv2dBNReLU(3, 4, 3)
    assert module_attributes(conv, ("weight", "bias", "bn")) == [conv.weight, None, conv.bn]
    fused = tcf.Conv2dBNReLU.from_modules(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), bn_registered_elsewhere=True)
    assert "bn" in fused.__dict__ and "bn" not in fused._modules
    assert_reads_as_getattr(fused, ("weight", "bias", "bn"))


def test_reads_a_parametrized_weight_not_the_original_it_replaces():
    conv = nn.Conv2d(3, 4, 3)
    parametrize.register_parametrization(conv, "weight", Double())
    assert "weight" not in conv._parameters  # moved to conv.parametrizations.weight.original
    assert_reads_as_getattr(conv, ("weight", "bias"))
    torch.testing.assert_close(module_attributes(conv, ("weight",))[0], 2 * conv.parametrizations.weight.original)


def test_reads_weight_norms_computed_weight_from_the_instance_dict():
    conv = nn.Conv2d(3, 4, 3)
    with pytest.warns(FutureWarning):
        nn.utils.weight_norm(conv)
    assert "weight" in conv.__dict__
    assert_reads_as_getattr(conv, ("weight", "bias"))


def test_reads_a_class_property_that_shadows_the_parameter_dicts():
    conv = ConvWithWeightProperty(3, 4, 3)
    conv._parameters["weight"] = nn.Parameter(torch.zeros(4, 3, 3, 3))  # what a dict read would wrongly return
    assert_reads_as_getattr(conv, ("weight",))
    torch.testing.assert_close(module_attributes(conv, ("weight",))[0], conv.base * 3)


def test_reads_a_swapped_or_deleted_parameter_and_raises_getattrs_error_for_a_missing_name():
    conv = nn.Conv2d(3, 4, 3)
    module_attributes(conv, ("weight",))
    conv.weight = nn.Parameter(torch.randn(4, 3, 3, 3))
    assert module_attributes(conv, ("weight",))[0] is conv.weight
    del conv.bias
    conv.bias = torch.ones(4)  # a plain attribute now, in __dict__
    assert module_attributes(conv, ("bias",))[0] is conv.bias
    conv.__dict__["weight"] = torch.zeros(4, 3, 3, 3)  # in the instance's dict and in _parameters: the dict's wins
    assert module_attributes(conv, ("weight",))[0] is conv.__dict__["weight"]
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        module_attributes(conv, ("nothing",))


@pytest.mark.parametrize("train", [True, False])
def test_a_fused_layer_with_a_parametrized_conv_and_batch_norm_matches_eager(train):
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
    parametrize.register_parametrization(plain[1], "weight", Double())
    fused = tcf.Conv2dBNReLU.from_modules(copy.deepcopy(plain[0]), copy.deepcopy(plain[1]))
    parametrize.register_parametrization(fused, "weight", Double())
    parametrize.register_parametrization(plain[0], "weight", Double())
    plain.train(train), fused.train(train)
    for _ in range(2):
        x = torch.randn(2, 3, 6, 5)
        torch.testing.assert_close(fused(x), plain(x))
    torch.testing.assert_close(fused.bn.running_mean, plain[1].running_mean)
