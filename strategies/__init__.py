"""Hypothesis strategies for swapspec: module trees, conversions, flag settings and functional_call inputs.

See each strategy's docstring for its options and shrinking rules, and ``python -m strategies.reach`` for the
measured reach of every feature.
"""

from swapspec.strategies.calls import (
    CallInput,
    FlagSetting,
    call_inputs,
    flag_settings,
    forward_inputs,
    meta_built,
)
from swapspec.strategies.contracts import Contract, ModuleConversion
from swapspec.strategies.conversions import (
    Conversion,
    ConversionError,
    conversions,
    value_changing_conversions,
)
from swapspec.strategies.devices import detected_devices, xla_device
from swapspec.strategies.host_leaves import HostModule
from swapspec.strategies.host_modules import host_trees
from swapspec.strategies.modules import (
    BATCH,
    FEATURES,
    ForwardError,
    Observation,
    SelfLoadingParameter,
    TaggedParameter,
)
from swapspec.strategies.state_dicts import LoadInput, state_dicts
from swapspec.strategies.tree_draws import module_trees, tree_specs
from swapspec.strategies.trees import TreeInfo, TreeSpec, build_tree, tree_info

__all__ = [
    "BATCH",
    "FEATURES",
    "CallInput",
    "Contract",
    "Conversion",
    "ConversionError",
    "FlagSetting",
    "ForwardError",
    "HostModule",
    "LoadInput",
    "ModuleConversion",
    "Observation",
    "SelfLoadingParameter",
    "TaggedParameter",
    "TreeInfo",
    "TreeSpec",
    "build_tree",
    "call_inputs",
    "conversions",
    "detected_devices",
    "flag_settings",
    "forward_inputs",
    "host_trees",
    "meta_built",
    "module_trees",
    "state_dicts",
    "tree_info",
    "tree_specs",
    "value_changing_conversions",
    "xla_device",
]
