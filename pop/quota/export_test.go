package quota

import (
	"io"
	"slices"
)

// ReadSnapshotForTest is ReadSnapshot (kept for the older tests' name).
var ReadSnapshotForTest = ReadSnapshot

// The binary snapshot's codec, for the external tests and the fuzzer.
var (
	DecodeSnapshotBodyForTest = decodeSnapshotBody
	WriteSnapshotJSONForTest  = writeSnapshotJSON
	WriteSnapshotForTest      = writeSnapshot
	BulkLoadForTest           = bulkLoad
)

// EncodeSnapshotForTest writes the binary form of quotas to w.
func EncodeSnapshotForTest(w io.Writer, version int64, quotas []*Quota) error {
	return encodeSnapshot(w, version, len(quotas), slices.Values(quotas))
}

// PlansForTest is the number of plans x's writer holds.
func PlansForTest(x *Index) int { return len(x.plans.list) }

// EncodeIndexForTest writes the binary snapshot of x's snapshot in force to
// w, as the Syncer saves it.
func EncodeIndexForTest(w io.Writer, x *Index) error {
	v := x.view()
	return encodeSnapshot(w, v.version, v.len(), v.quotas())
}
