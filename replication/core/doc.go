// Package core is edgelimit's replication protocol as a pure, deterministic
// state machine, in the shape of etcd-io/raft's RawNode: time comes in as
// Tick(now), received messages as Step(now, m), the PoP's own news as
// BitsIssued(now) and Urgent(now), publish failures as Failed(m); what must
// happen comes out as a Ready — own slots to save durably, messages to
// publish, remote state to apply, a changed share of global limits — which
// the driver carries out before it calls Advance.
//
// The protocol: every FlushInterval a PoP publishes its delta (the absolute
// counts of its own slots that changed) and the mitigation bits it issued;
// bits issued between flushes go at once, at most once per BitsInterval, and
// so does the delta when the store reports a key near its limit (Urgent).
// Every SnapshotInterval it publishes its full own state and active bits
// (anti-entropy), and a snapshot also goes at the next flush when another
// PoP appeared or one of its numbered presence beacons went missing. Every
// HelloInterval it sends a beacon; regions not heard for UnreachableAfter
// count as cut off, and the PoP enforces region.Share of global limits. A
// delta or bits message that fails is retried: its slots and bits join the
// next flush.
//
// Two drivers run this core: replication's NATS JetStream Replicator (wall
// clock, Pebble, protobuf), and the simulator (virtual clock, simulated
// network, structured messages). The core does no IO, reads no clock, starts
// no goroutine and draws no random number; it reads the PoP's state
// synchronously through Counts and Bits, as raft reads its Storage. Given the
// same inputs it produces the same Readys.
//
// core imports only the standard library, crdt and region.
package core
