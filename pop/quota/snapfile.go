package quota

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// snapshotFile is the on-disk form of a set of quotas at a version: the
// embedded store's state and a PoP's last snapshot of PostgreSQL.
type snapshotFile struct {
	Version int64   `json:"version"`
	Quotas  []*Wire `json:"quotas"`
}

// writeSnapshot writes quotas at version to path atomically: a temporary
// file, synced, renamed over path, and the directory synced, so that a crash
// leaves the old file or the new one.
func writeSnapshot(path string, version int64, quotas []*Quota) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	w := bufio.NewWriterSize(tmp, 1<<20)
	f := snapshotFile{Version: version, Quotas: make([]*Wire, len(quotas))}
	for i, q := range quotas {
		f.Quotas[i] = q.ToWire()
	}
	if err := json.NewEncoder(w).Encode(&f); err != nil {
		tmp.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// readSnapshot reads a file writeSnapshot wrote; a missing file is
// os.ErrNotExist, a damaged one an error naming the file and the problem.
func readSnapshot(path string) ([]*Quota, int64, error) {
	b, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer b.Close()
	var f snapshotFile
	dec := json.NewDecoder(bufio.NewReaderSize(b, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, 0, fmt.Errorf("quota: %s is damaged: %w", path, err)
	}
	out := make([]*Quota, 0, len(f.Quotas))
	for i, w := range f.Quotas {
		q, err := FromWire("", w)
		if err != nil {
			return nil, 0, fmt.Errorf("quota: %s: quotas[%d]: %w", path, i, err)
		}
		out = append(out, q)
	}
	return out, f.Version, nil
}
