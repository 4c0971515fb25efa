"""The preset table of docs/algorithms.md, written out by hand: what tests/glue/test_presets.py checks every preset
against and tests/test_cli.py compares `verl-offpolicy list` with."""

REC = dict(adv="grpo", norm=False, loss="rec", agg="token-mean", anchor="behaviour", weight="none", reg="none")

# The preset table of docs/algorithms.md ("Presets"), written out by hand.
SPEC = {
    "grpo": dict(adv="grpo", norm=True, loss="vanilla", agg="token-mean", anchor="behaviour", eps=(0.2, 0.2)),
    "grpo_proximal": dict(adv="grpo", norm=True, loss="vanilla", agg="token-mean", anchor="proximal", eps=(0.2, 0.2)),
    "opmd": dict(adv="opmd", baseline="mean", loss="opmd", tau=1.0, agg="token-mean"),
    "opmd_kimi": dict(REC, clip="none", reg="k2", coef=0.1),
    "pmd_mean": dict(adv="rloo", loss="pmd", tau=0.01, agg="seq-mean-token-mean", anchor="behaviour"),
    "pmd_partition": dict(adv="pmd_partition", loss="pmd", tau=0.01, anchor="behaviour"),
    "rec_oneside_nois": dict(REC, clip="one-side", eps=(0.2, 0.2)),
    "rec_oneside_is": dict(REC, clip="one-side", weight="importance_sampling", eps=(0.2, 0.2)),
    "rec_oneside_nois_wide": dict(REC, clip="one-side", eps=(0.6, 2.0)),
    "rec_twoside_nois": dict(REC, clip="two-side", eps=(0.2, 0.2)),
    "rec_twoside_is": dict(REC, clip="two-side", weight="importance_sampling", eps=(0.2, 0.2)),
    "rec_ring_nois": dict(REC, clip="ring", eps=(0.2, 0.2), ring=(0.6, 2.0)),
    "rec_gspo_nois": dict(REC, clip="gspo-one-side", eps=(3e-4, 4e-4), agg="seq-mean-token-mean"),
    "rec_gspo_is": dict(
        REC, clip="gspo-one-side", weight="gspo_importance_sampling", eps=(3e-4, 4e-4), agg="seq-mean-token-mean"
    ),
    "red_drop": dict(adv="red_drop", loss="rec", clip="none", weight="none", reg="none"),
    "red_weight": dict(adv="red_weight", temperature=1.0, loss="rec", clip="none", weight="none", reg="none"),
    "asymre": dict(adv="asymre", shift=-0.1, loss="rec", clip="none", weight="none", reg="none"),
    "agro": dict(adv="agro", beta=0.1, on_policy=False, loss="rec", clip="none", agg="seq-mean-token-sum", kl=True),
    "agro_onpolicy": dict(
        adv="agro", beta=0.1, on_policy=True, loss="rec", clip="none", agg="seq-mean-token-sum", kl=True
    ),
    "m2po": dict(
        adv="grpo",
        norm=True,
        loss="m2po",
        m2=0.04,
        pool="trust_region",
        agg="token-mean",
        anchor="behaviour",
        fsdp_only=True,
    ),
    "topr": dict(adv="topr", loss="topr", topr_c=0.0, topr_reward="signed", agg="token-mean", anchor="behaviour"),
    "topr_group_mean": dict(adv="grpo", norm=False, loss="topr", agg="token-mean", anchor="behaviour"),
    "oapl": dict(adv="oapl", beta1=1.0, loss="oapl", beta2=1e-3, agg="seq-mean-token-sum", anchor="behaviour"),
    "pairwise_opmd": dict(adv="pairwise_opmd", loss="pairwise_opmd", tau_kl=0.1, agg="seq-mean-token-sum", kl=True),
    "reinforce": dict(adv="grpo", norm=False, loss="rec", clip="none", weight="none", reg="none", agg="token-mean"),
    "rec_ring_is": dict(REC, clip="ring", weight="importance_sampling", eps=(0.2, 0.2), ring=(0.6, 2.0)),
    "rec_oneside_is_wide": dict(REC, clip="one-side", weight="importance_sampling", eps=(0.6, 2.0)),
}
