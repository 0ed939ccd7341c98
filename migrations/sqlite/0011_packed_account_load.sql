-- A shard's account rates packed into one value beside its own rate: a report of a
-- thousand accounts then writes one row, not a thousand (see src/store/load.rs for the
-- layout). NULL until a report on the shard is folded by a keyspread that packs; its
-- `account_load` rows, if any, are packed then and deleted. The table stays for
-- keyspreads that predate this (migrations only add).
ALTER TABLE shard_load ADD COLUMN accounts BLOB;
