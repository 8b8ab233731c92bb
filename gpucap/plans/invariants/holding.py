"""Rules about who holds which GPU: never two VMs on one card, a VM's allocations and usage as
its state says, and no VM stuck on its way in or out."""

from gpucap.plans.invariants.base import HOLDING_STATES, Audit, Violation, at, rows, seconds


def gpu_held_twice(audit: Audit) -> list[Violation]:
    """Allocations of one GPU whose intervals overlap. Set-based: each allocation is compared
    with the latest release of the GPU's earlier allocations (a window), and only the ones that
    start before it are joined back to name the holder they overlap."""
    found = rows(
        """
        WITH ordered AS (
            SELECT id, gpu_id, vm_id, created_at, released_at,
                   max(COALESCE(released_at, 'infinity')) OVER (
                       PARTITION BY gpu_id ORDER BY created_at, id
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
                   ) AS earlier_held_until
            FROM {allocation}
        )
        SELECT n.hostname, g.index AS gpu_index,
               earlier.id AS first_allocation, earlier.vm_id AS first_vm,
               earlier.created_at AS first_from, earlier.released_at AS first_until,
               later.id AS second_allocation, later.vm_id AS second_vm,
               later.created_at AS second_from, later.released_at AS second_until
        FROM ordered later
        JOIN {allocation} earlier
          ON earlier.gpu_id = later.gpu_id
         AND (earlier.created_at, earlier.id) < (later.created_at, later.id)
         AND COALESCE(earlier.released_at, 'infinity') > later.created_at
        JOIN {gpu} g ON g.id = later.gpu_id
        JOIN {node} n ON n.id = g.node_id
        WHERE later.earlier_held_until > later.created_at
        ORDER BY n.hostname, g.index, later.created_at
        LIMIT %(limit)s
        """,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="gpu_held_twice",
            subject=f"{row['hostname']} GPU {row['gpu_index']}",
            why=f"vm-{row['first_vm']} held it from {at(row['first_from'])} until "
            f"{at(row['first_until'])}, and vm-{row['second_vm']} took it at "
            f"{at(row['second_from'])} while vm-{row['first_vm']} still held it",
            rows=row,
        )
        for row in found
    ]


def holding_matches_state(audit: Audit) -> list[Violation]:
    found = rows(
        """
        WITH live AS (
            SELECT a.vm_id, count(*) AS gpus,
                   count(*) FILTER (WHERE g.node_id IS DISTINCT FROM v.node_id) AS off_node
            FROM {allocation} a
            JOIN {gpu} g ON g.id = a.gpu_id
            JOIN {vm} v ON v.id = a.vm_id
            WHERE a.released_at IS NULL
            GROUP BY a.vm_id
        ), open_usage AS (
            SELECT vm_id, count(*) AS intervals FROM {usage}
            WHERE ended_at IS NULL GROUP BY vm_id
        )
        SELECT v.id AS vm, v.state, v.gpu_count, COALESCE(l.gpus, 0) AS live_allocations,
               COALESCE(l.off_node, 0) AS allocations_off_node,
               COALESCE(u.intervals, 0) AS open_usage_intervals
        FROM {vm} v
        LEFT JOIN live l ON l.vm_id = v.id
        LEFT JOIN open_usage u ON u.vm_id = v.id
        WHERE (v.state = ANY(%(holding)s)
               AND (COALESCE(l.gpus, 0) <> v.gpu_count OR COALESCE(l.off_node, 0) > 0
                    OR COALESCE(u.intervals, 0) <> 1))
           OR (v.state <> ALL(%(holding)s) AND (l.vm_id IS NOT NULL OR u.vm_id IS NOT NULL))
        ORDER BY v.id
        LIMIT %(limit)s
        """,
        holding=HOLDING_STATES,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="holding_matches_state",
            subject=f"vm-{row['vm']}",
            why=_holding_words(row),
            rows=row,
        )
        for row in found
    ]


def _holding_words(row: dict) -> str:
    state, problems = row["state"], []
    if state in HOLDING_STATES:
        if row["live_allocations"] != row["gpu_count"]:
            problems.append(
                f"holds {row['live_allocations']} GPU(s) but asked for {row['gpu_count']}"
            )
        if row["allocations_off_node"]:
            problems.append(f"{row['allocations_off_node']} of its GPUs are on another node")
        if row["open_usage_intervals"] != 1:
            problems.append(
                f"has {row['open_usage_intervals']} open usage intervals instead of one"
            )
    else:
        if row["live_allocations"]:
            problems.append(f"still holds {row['live_allocations']} GPU(s)")
        if row["open_usage_intervals"]:
            problems.append("still has an open usage interval (it is being billed)")
    return f"it is {state}, yet it " + " and ".join(problems)


def nothing_stuck(audit: Audit) -> list[Violation]:
    found = rows(
        """
        SELECT v.id AS vm, v.state, v.updated_at AS since, n.hostname AS node
        FROM {vm} v LEFT JOIN {node} n ON n.id = v.node_id
        WHERE v.state IN ('provisioning', 'stopping') AND v.updated_at < %(cutoff)s
        ORDER BY v.updated_at, v.id
        LIMIT %(limit)s
        """,
        cutoff=audit.now - audit.stuck_after,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="nothing_stuck",
            subject=f"vm-{row['vm']}",
            why=f"it has been {row['state']} on {row['node']} since {at(row['since'])} "
            f"({seconds(audit.now - row['since'])}, more than {seconds(audit.stuck_after)})",
            rows=row,
        )
        for row in found
    ]
