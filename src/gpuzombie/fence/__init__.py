"""`gpuzombie fence`: keep the scheduler off dirty GPUs. A GPU the fleet's verdict calls dirty (memory
held by a stale, foreign, D-state or ghost holder; read from Prometheus) gets one DRA
``DeviceTaintRule`` with effect NoSchedule on its device; the rule goes once the GPU has read clean
for a number of evaluations in a row. ``decide`` is the pure decision, ``controller`` the pass that
reads and applies it (docs/handover.md)."""
