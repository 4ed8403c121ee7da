-- The step before a script on a run, under Redis Cluster (where the run's slot is not its
-- shard's): marks the run in the outbox index and changes its shard's indexes as `index`
-- says (see `shard.lua`); returns the mark.
return shard_step(outbox_index_key, awaiting_key, deadlines_key, reminders_key, run, index)
