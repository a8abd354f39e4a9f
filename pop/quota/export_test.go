package quota

// ReadSnapshotForTest exposes readSnapshot to the external tests.
var ReadSnapshotForTest = readSnapshot
