// Package quota is the tenant quota store: per API key, a tier and overrides
// of named limits (requests per unit), each with the time it takes effect and
// the time it expires, and an append-only audit trail of every change (who,
// when, the quota before and after).
//
// PostgreSQL is the system of record (Postgres, with its migrations embedded
// and applied at start); File is the embedded default for a single PoP, kept
// under its data directory. Both implement Store. Every PoP holds all
// quotas in memory in an Index, whose lookup on the check path does not
// allocate, swapped atomically as a versioned snapshot; a Syncer keeps the
// Index up to date from a Store (a notification, or polling as a backstop) and
// keeps the last snapshot on disk, so that a PoP restarted while PostgreSQL
// is down still enforces the overrides it last saw.
//
// The version of a snapshot is the id of the last audit entry it includes:
// the audit trail is also the change log every PoP follows.
//
// quota imports pop/rules (units, limits) and nothing else of ours.
package quota
