// Package edgelimitpb holds edgelimit's wire formats: the protocol buffer
// messages (package edgelimit.v1, defined in edgelimit.proto) that points of
// presence (PoPs) exchange and store.
//
//   - DeltaBatch is what a PoP publishes every flush interval: the ABSOLUTE
//     counts of its own (key, window) slots that changed, grouped by window
//     into parallel arrays of keys and counts (WindowSlots). Receivers join by
//     keeping the per-replica maximum, so duplicates, reordering and
//     redelivery are harmless.
//   - MitigationBatch carries mitigation bits (MitigationBit): "this key is
//     over its region-wide or global limit until t". A join keeps the latest
//     end time per (key, scope).
//   - Snapshot is a PoP's full state, every replica's slots (ReplicaSlots of
//     Slot) and the live bits, for anti-entropy and for saving in Pebble.
//
// Keys are the opaque, length-prefixed binary store keys of the rules package,
// so they are bytes fields: any byte string decodes. Windows and instants are
// unix nanoseconds.
//
// edgelimit.pb.go is generated from edgelimit.proto and committed. Change the
// .proto file, run `make proto`, and commit both; `make lint` runs `make
// verify-proto`, which fails when the committed code is stale. The generators
// are pinned: protoc 3.21.12 (Debian bookworm's protobuf-compiler) and
// protoc-gen-go v1.36.12 (a tool dependency in go.mod). The rest of this
// package is written by hand: Revision, and the Validate, Add and Range
// methods that the parallel-array layout needs.
//
// # Compatibility
//
// A PoP must read what any other PoP writes during a rolling upgrade, and the
// snapshots it wrote itself before an upgrade. The rules, stated in full at the
// top of edgelimit.proto:
//
//   - released field numbers and types never change, and a number or name is
//     never reused; a removed field is reserved;
//   - a new field must be safe to ignore, its zero value meaning what the old
//     format meant; readers skip unknown fields, and the Go runtime keeps them,
//     so a relay passes them on;
//   - a writer that relies on a field whose loss would lose counts or bits
//     raises Revision and sets required_revision (field 15 of every top-level
//     message); Validate rejects a message that requires a newer Revision than
//     this package knows, with ErrNewerRevision, so the reader drops and counts
//     it instead of applying half of it;
//   - anything else is a new package, edgelimit.v2, on new subjects and keys.
//
// # Receiving
//
// Decoding rejects only malformed protobuf and invalid UTF-8 in the string
// fields (replica, region, origin). A message that decodes may still be
// unusable; call Validate before joining it, and drop and count the message
// when it fails:
//
//	var b edgelimitpb.DeltaBatch
//	if err := proto.Unmarshal(data, &b); err != nil {
//		return fmt.Errorf("delta batch: %w", err)
//	}
//	if err := b.Validate(); err != nil {
//		return err
//	}
//	b.Range(func(key []byte, window int64, count uint64) bool {
//		counters.Join(crdt.Slot{Key: string(key), Window: window, Replica: b.GetReplica(), Count: count})
//		return true
//	})
//
// This package imports google.golang.org/protobuf and the standard library
// only, and nothing else in edgelimit; the packages that move or store these
// messages (replication, the Pebble store) convert them to and from their own
// types. The generated types, like every protobuf message, are not safe for
// concurrent mutation.
package edgelimitpb
