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
