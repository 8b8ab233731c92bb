"""Rules about notices and what the arbiter may do to a VM: a notice agrees with its VM, lasts
its set's notice_seconds, is sent once per plan and victim, and its deadline is kept (never
early, never late); a reclaimed spot VM waits to resume; an on-demand VM is never touched."""

from gpucap.plans.invariants.base import VM_EVENT, Audit, Violation, at, rows, seconds

# The audit events of a VM letting go of its GPUs (vm_transition writes ``vm.<new state>``).
_EXITS = "('vm.pending', 'vm.stopped', 'vm.terminated', 'vm.failed')"


def notice_matches_vm(audit: Audit) -> list[Violation]:
    found = rows(
        """
        SELECT 'open notice, VM not notified or stopping' AS problem, n.id AS notice,
               n.vm_id AS vm, v.state, n.outcome, p.status AS plan_status, n.plan_id AS plan
        FROM {notice} n JOIN {vm} v ON v.id = n.vm_id LEFT JOIN {plan} p ON p.id = n.plan_id
        WHERE n.completed_at IS NULL AND v.state NOT IN ('notified', 'stopping')
        UNION ALL
        SELECT 'completed notice without an outcome', n.id, n.vm_id, v.state, n.outcome,
               p.status, n.plan_id
        FROM {notice} n JOIN {vm} v ON v.id = n.vm_id LEFT JOIN {plan} p ON p.id = n.plan_id
        WHERE n.completed_at IS NOT NULL AND n.outcome = ''
        UNION ALL
        SELECT 'notice from a plan that was not applied', n.id, n.vm_id, v.state, n.outcome,
               p.status, n.plan_id
        FROM {notice} n JOIN {vm} v ON v.id = n.vm_id JOIN {plan} p ON p.id = n.plan_id
        WHERE p.status <> 'applied'
        UNION ALL
        SELECT 'notified VM without an open notice', NULL, v.id, v.state, NULL, NULL, NULL
        FROM {vm} v
        WHERE v.state = 'notified' AND NOT EXISTS (
            SELECT 1 FROM {notice} n WHERE n.vm_id = v.id AND n.completed_at IS NULL)
        ORDER BY vm, notice
        LIMIT %(limit)s
        """,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="notice_matches_vm",
            subject=f"notice {row['notice']}" if row["notice"] else f"vm-{row['vm']}",
            why=_notice_words(row),
            rows=row,
        )
        for row in found
    ]


def _notice_words(row: dict) -> str:
    problem = row["problem"]
    if problem.startswith("open notice"):
        return f"it is open, but its VM vm-{row['vm']} is {row['state']} (not notified/stopping)"
    if problem.startswith("completed notice"):
        return f"it is completed (vm-{row['vm']} is {row['state']}) but says no outcome"
    if problem.startswith("notice from a plan"):
        return f"it was sent to vm-{row['vm']} by plan {row['plan']}, which is {row['plan_status']}"
    return "it is notified, but has no open notice: no deadline will stop it"


def notice_length(audit: Audit) -> list[Violation]:
    """The set's notice_seconds in force when the notice was issued: the ``before`` of the set's
    first notice_seconds change after it, else today's value."""
    found = rows(
        """
        SELECT n.id AS notice, n.vm_id AS vm, cs.name AS capacity_set, n.issued_at, n.deadline,
               EXTRACT(EPOCH FROM n.deadline - n.issued_at)::float AS given_seconds,
               COALESCE(changed.notice_seconds, cs.notice_seconds) AS set_seconds
        FROM {notice} n
        JOIN {vm} v ON v.id = n.vm_id
        JOIN {pool} po ON po.id = v.pool_id
        JOIN {capacity_set} cs ON cs.id = po.capacity_set_id
        LEFT JOIN LATERAL (
            SELECT (e.before->>'notice_seconds')::int AS notice_seconds
            FROM {event} e
            WHERE e.object_type = 'capacityset' AND e.object_id = cs.id::text
              AND e.verb = 'capacity_set.update' AND e.before ? 'notice_seconds'
              AND e.created_at > n.issued_at
            ORDER BY e.created_at, e.id LIMIT 1
        ) changed ON true
        WHERE n.reason = 'arbiter'
          AND n.deadline - n.issued_at
              <> make_interval(secs => COALESCE(changed.notice_seconds, cs.notice_seconds))
        ORDER BY n.id
        LIMIT %(limit)s
        """,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="notice_length",
            subject=f"notice {row['notice']}",
            why=f"vm-{row['vm']} was given {row['given_seconds']:.1f} s (issued "
            f"{at(row['issued_at'])}, deadline {at(row['deadline'])}), but capacity set "
            f"{row['capacity_set']} gives {row['set_seconds']} s",
            rows=row,
        )
        for row in found
    ]


def one_notice_per_victim(audit: Audit) -> list[Violation]:
    found = rows(
        """
        SELECT plan_id AS plan, vm_id AS vm, count(*) AS notices,
               array_agg(id ORDER BY id) AS notice_ids
        FROM {notice} WHERE plan_id IS NOT NULL
        GROUP BY plan_id, vm_id HAVING count(*) > 1
        ORDER BY plan_id, vm_id
        LIMIT %(limit)s
        """,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="one_notice_per_victim",
            subject=f"plan {row['plan']}",
            why=f"it sent vm-{row['vm']} {row['notices']} notices "
            f"({', '.join(str(n) for n in row['notice_ids'])})",
            rows=row,
        )
        for row in found
    ]


def deadline_kept(audit: Audit) -> list[Violation]:
    """The VM's stop is its first transition out of ``notified`` after the notice (its audit
    event); its release is the notice's completion (when the VM let go of its GPUs)."""
    found = rows(
        f"""
        SELECT n.id AS notice, n.vm_id AS vm, n.reason, n.issued_at, n.deadline,
               n.outcome, n.completed_at AS released_at, stop.created_at AS stopped_at,
               stop.after->>'stop_reason' AS stop_reason
        FROM {{notice}} n
        LEFT JOIN LATERAL (
            SELECT e.created_at, e.verb, e.after FROM {{event}} e
            WHERE e.object_type = %(vm_event)s AND e.object_id = n.vm_id::text
              AND (e.verb = 'vm.stopping' OR e.verb IN {_EXITS})
              AND e.created_at >= n.issued_at
            ORDER BY e.created_at, e.id LIMIT 1
        ) stop ON true
        WHERE (stop.verb = 'vm.stopping' AND stop.created_at < n.deadline
               AND n.outcome NOT IN ('acknowledged', 'guest_shutdown')
               AND COALESCE(stop.after->>'stop_reason', '') NOT IN ('owner', 'terminate'))
           OR COALESCE(n.completed_at, %(now)s) > n.deadline + %(tolerance)s
        ORDER BY n.deadline, n.id
        LIMIT %(limit)s
        """,
        vm_event=VM_EVENT,
        now=audit.now,
        tolerance=audit.deadline_tolerance,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="deadline_kept",
            subject=f"notice {row['notice']}",
            why=_deadline_words(row, audit),
            rows=row,
        )
        for row in found
    ]


def _deadline_words(row: dict, audit: Audit) -> str:
    vm, deadline = f"vm-{row['vm']}", row["deadline"]
    if row["stopped_at"] is not None and row["stopped_at"] < deadline:
        return (
            f"{vm} was stopped at {at(row['stopped_at'])}, "
            f"{seconds(deadline - row['stopped_at'])} before its deadline {at(deadline)}, "
            "though its guest neither acknowledged nor shut down"
        )
    if row["released_at"] is None:
        return (
            f"{vm} still holds its GPUs {seconds(audit.now - deadline)} after its deadline "
            f"{at(deadline)} (tolerance {seconds(audit.deadline_tolerance)})"
        )
    return (
        f"{vm} let go of its GPUs at {at(row['released_at'])}, "
        f"{seconds(row['released_at'] - deadline)} after its deadline {at(deadline)} "
        f"(tolerance {seconds(audit.deadline_tolerance)})"
    )


def reclaimed_spot_resumes(audit: Audit) -> list[Violation]:
    """After an arbiter notice (or a preemption while booting, which sends none), a spot VM's
    next release is back to pending, or its owner ended it: never ``stopped`` unless its owner
    stopped it."""
    found = rows(
        f"""
        WITH reclaims AS (
            SELECT n.vm_id, n.issued_at AS since, n.plan_id, n.id AS notice
            FROM {{notice}} n WHERE n.reason = 'arbiter'
            UNION ALL
            SELECT a.vm_id, p.applied_at, p.id, NULL
            FROM {{plan_action}} a JOIN {{plan}} p ON p.id = a.plan_id
            WHERE a.kind = 'preemption' AND a.progress = 'done' AND p.status = 'applied'
              AND NOT EXISTS (SELECT 1 FROM {{notice}} n
                              WHERE n.plan_id = p.id AND n.vm_id = a.vm_id)
        )
        SELECT r.vm_id AS vm, r.plan_id AS plan, r.notice, r.since,
               released.verb AS released_to, released.created_at AS released_at,
               stop.after->>'stop_reason' AS stop_reason
        FROM reclaims r
        JOIN {{vm}} v ON v.id = r.vm_id
        JOIN {{pool}} po ON po.id = v.pool_id
        JOIN LATERAL (
            SELECT e.verb, e.created_at FROM {{event}} e
            WHERE e.object_type = %(vm_event)s AND e.object_id = r.vm_id::text
              AND e.verb IN {_EXITS} AND e.created_at >= r.since
            ORDER BY e.created_at, e.id LIMIT 1
        ) released ON true
        LEFT JOIN LATERAL (
            SELECT e.after FROM {{event}} e
            WHERE e.object_type = %(vm_event)s AND e.object_id = r.vm_id::text
              AND e.verb = 'vm.stopping' AND e.created_at >= r.since
              AND e.created_at <= released.created_at
            ORDER BY e.created_at DESC, e.id DESC LIMIT 1
        ) stop ON true
        WHERE po.kind = 'spot' AND released.verb = 'vm.stopped'
          AND COALESCE(stop.after->>'stop_reason', '') <> 'owner'
        ORDER BY r.since, r.vm_id
        LIMIT %(limit)s
        """,
        vm_event=VM_EVENT,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="reclaimed_spot_resumes",
            subject=f"vm-{row['vm']}",
            why=f"the arbiter reclaimed this spot VM (plan {row['plan']}, at {at(row['since'])}) "
            f"and it went to stopped at {at(row['released_at'])} instead of back to pending",
            rows=row,
        )
        for row in found
    ]


def on_demand_untouched(audit: Audit) -> list[Violation]:
    found = rows(
        """
        SELECT 'an arbiter notice' AS what, n.id AS ref, n.vm_id AS vm, n.issued_at AS at,
               n.plan_id AS plan
        FROM {notice} n JOIN {vm} v ON v.id = n.vm_id JOIN {pool} po ON po.id = v.pool_id
        WHERE n.reason = 'arbiter' AND po.kind = 'on_demand'
        UNION ALL
        SELECT 'a preemption in an applied plan', a.id, a.vm_id, p.applied_at, p.id
        FROM {plan_action} a JOIN {plan} p ON p.id = a.plan_id
        JOIN {vm} v ON v.id = a.vm_id JOIN {pool} po ON po.id = v.pool_id
        WHERE a.kind = 'preemption' AND p.status = 'applied' AND po.kind = 'on_demand'
        UNION ALL
        SELECT 'a preemptive stop', e.id, v.id, e.created_at, NULL
        FROM {event} e JOIN {vm} v ON e.object_id = v.id::text
        JOIN {pool} po ON po.id = v.pool_id
        WHERE e.object_type = %(vm_event)s AND e.verb = 'vm.stopping'
          AND e.after->>'stop_reason' = 'preempted' AND po.kind = 'on_demand'
        ORDER BY at, vm
        LIMIT %(limit)s
        """,
        vm_event=VM_EVENT,
        limit=audit.limit,
    )
    return [
        Violation(
            rule="on_demand_untouched",
            subject=f"vm-{row['vm']}",
            why=f"an on-demand VM got {row['what']} at {at(row['at'])}"
            + (f" (plan {row['plan']})" if row["plan"] else ""),
            rows=row,
        )
        for row in found
    ]
