"""Rules about plans: each applied plan applied once, none breaking a floor, every placement
that waits for its victims has someone to wait for, and the VMs at risk are the proposed plans'
victims."""

from gpucap.plans.invariants.base import Audit, Violation, at, rows, seconds


def one_apply_per_plan(audit: Audit) -> list[Violation]:
    """Every apply writes one ``plan.approve`` (an operator) or ``plan.enforce`` (enforcement)
    event naming the plan. Plans pruned since are judged by their events alone."""
    found = rows(
        """
        WITH applies AS (
            SELECT (e.after->>'plan')::bigint AS plan_id, count(*) AS applies,
                   array_agg(e.id ORDER BY e.id) AS events
            FROM {event} e
            WHERE e.verb IN ('plan.approve', 'plan.enforce') AND e.after ? 'plan'
            GROUP BY 1
        )
        SELECT COALESCE(p.id, a.plan_id) AS plan, p.status, COALESCE(a.applies, 0) AS applies,
               a.events
        FROM {plan} p FULL JOIN applies a ON a.plan_id = p.id
        WHERE (p.status = 'applied' AND COALESCE(a.applies, 0) <> 1)
           OR (p.id IS NOT NULL AND p.status <> 'applied' AND a.applies > 0)
           OR (p.id IS NULL AND a.applies > 1)
        ORDER BY 1
        LIMIT %(limit)s
        """,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="one_apply_per_plan",
            subject=f"plan {row['plan']}",
            why=_apply_words(row),
            rows=row,
        )
        for row in found
    ]


def _apply_words(row: dict) -> str:
    status, applies = row["status"], row["applies"]
    if status == "applied" and applies == 0:
        return "it is applied, but no plan.approve or plan.enforce event records the apply"
    if status in (None, "applied"):
        return f"it was applied {applies} times (audit events {row['events']})"
    return f"it is {status}, yet {applies} apply event(s) name it (audit events {row['events']})"


def floors_held(audit: Audit) -> list[Violation]:
    """Each pool of each applied plan, as the plan stored it (before and after the plan)."""
    found = rows(
        """
        SELECT p.id AS plan, cs.name AS capacity_set, pool->>'name' AS pool,
               (pool->>'floor_gpus')::int AS floor_gpus,
               (pool->>'before_gpus')::int AS before_gpus,
               (pool->>'after_gpus')::int AS after_gpus, p.applied_at
        FROM {plan} p
        JOIN {capacity_set} cs ON cs.id = p.capacity_set_id
        CROSS JOIN LATERAL jsonb_array_elements(p.pools) AS pool
        WHERE p.status = 'applied'
          AND (pool->>'after_gpus')::int
              < LEAST((pool->>'floor_gpus')::int, (pool->>'before_gpus')::int)
        ORDER BY p.id, pool->>'name'
        LIMIT %(limit)s
        """,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="floors_held",
            subject=f"plan {row['plan']}",
            why=f"applied at {at(row['applied_at'])}, it took pool {row['pool']} of "
            f"{row['capacity_set']} from {row['before_gpus']} to {row['after_gpus']} GPUs, "
            f"below its floor of {row['floor_gpus']}",
            rows=row,
        )
        for row in found
    ]


def placement_waits_for_someone(audit: Audit) -> list[Violation]:
    """A placement left ``waiting`` by an apply is completed by the next tick once its victims
    are off. It is stuck when no VM is leaving for it (notified or stopping, preempted for it
    or holding its GPUs) and nothing changed on its GPUs for longer than the stuck setting."""
    found = rows(
        """
        SELECT a.id AS action, a.plan_id AS plan, a.vm_id AS vm, n.hostname AS node, a.gpus,
               GREATEST(p.applied_at, freed.at) AS waiting_since
        FROM {plan_action} a
        JOIN {plan} p ON p.id = a.plan_id
        JOIN {node} n ON n.id = a.node_id
        LEFT JOIN LATERAL (
            SELECT max(al.released_at) AS at
            FROM {allocation} al JOIN {gpu} g ON g.id = al.gpu_id
            WHERE g.node_id = a.node_id
              AND g.index IN (SELECT jsonb_array_elements_text(a.gpus)::int)
        ) freed ON true
        WHERE a.kind = 'placement' AND a.progress = 'waiting'
          AND NOT EXISTS (
              SELECT 1 FROM {vm} leaving
              WHERE leaving.state IN ('notified', 'stopping')
                AND (leaving.preempted_for_id = a.vm_id OR EXISTS (
                    SELECT 1 FROM {allocation} al JOIN {gpu} g ON g.id = al.gpu_id
                    WHERE al.vm_id = leaving.id AND al.released_at IS NULL
                      AND g.node_id = a.node_id
                      AND g.index IN (SELECT jsonb_array_elements_text(a.gpus)::int))))
          AND GREATEST(p.applied_at, freed.at) < %(cutoff)s
        ORDER BY a.plan_id, a.position
        LIMIT %(limit)s
        """,
        cutoff=audit.now - audit.stuck_after,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="placement_waits_for_someone",
            subject=f"plan {row['plan']}",
            why=f"its placement of vm-{row['vm']} on {row['node']} GPUs {row['gpus']} has waited "
            f"since {at(row['waiting_since'])} ({seconds(audit.now - row['waiting_since'])}) "
            "with no VM leaving for it",
            rows=row,
        )
        for row in found
    ]


def at_risk_matches_plans(audit: Audit) -> list[Violation]:
    """A VM is at risk exactly while its set's proposed plan names it as a victim, and since no
    later than that plan was made (an earlier proposal may have named it first)."""
    found = rows(
        """
        WITH named AS (
            SELECT a.vm_id, p.id AS plan, p.created_at AS plan_made
            FROM {plan_action} a JOIN {plan} p ON p.id = a.plan_id
            WHERE p.status = 'proposed' AND a.kind = 'preemption'
        )
        SELECT v.id AS vm, v.at_risk_since, n.plan, n.plan_made
        FROM {vm} v LEFT JOIN named n ON n.vm_id = v.id
        WHERE (v.at_risk_since IS NOT NULL OR n.vm_id IS NOT NULL)
          AND (v.at_risk_since IS NULL OR n.vm_id IS NULL OR v.at_risk_since > n.plan_made)
        ORDER BY v.id
        LIMIT %(limit)s
        """,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="at_risk_matches_plans",
            subject=f"vm-{row['vm']}",
            why=_at_risk_words(row),
            rows=row,
        )
        for row in found
    ]


def _at_risk_words(row: dict) -> str:
    if row["plan"] is None:
        return f"it is at risk since {at(row['at_risk_since'])}, but no proposed plan names it"
    if row["at_risk_since"] is None:
        return f"proposed plan {row['plan']} names it as a victim, but it is not at risk"
    return (
        f"it is at risk since {at(row['at_risk_since'])}, later than proposed plan "
        f"{row['plan']} that names it was made ({at(row['plan_made'])})"
    )
