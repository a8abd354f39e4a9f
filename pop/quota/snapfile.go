package quota

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// A snapshot file is the on-disk form of a set of quotas at a version: the
// embedded store's state and a PoP's last snapshot of PostgreSQL. It is JSON
// lines — a header {"version":N,"count":M}, then one quota per line as the
// admin API shows it — so that a million quotas are written and read one at
// a time, never as one value in memory.
type snapshotHeader struct {
	Version int64 `json:"version"`
	Count   int   `json:"count"`
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
	enc := json.NewEncoder(w) // one line per Encode
	err = enc.Encode(snapshotHeader{Version: version, Count: len(quotas)})
	for i := 0; i < len(quotas) && err == nil; i++ {
		err = enc.Encode(quotas[i].ToWire())
	}
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
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
// os.ErrNotExist, a damaged one an error naming the file, the line and the
// problem.
func readSnapshot(path string) ([]*Quota, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(bufio.NewReaderSize(f, 1<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var h snapshotHeader
	if !sc.Scan() {
		return nil, 0, fmt.Errorf("quota: %s is damaged: no header line (%v)", path, sc.Err())
	}
	if err := strictUnmarshal(sc.Bytes(), &h); err != nil {
		return nil, 0, fmt.Errorf("quota: %s:1 is damaged: %w", path, err)
	}
	out := make([]*Quota, 0, h.Count)
	in := interner{}
	line := 1
	for sc.Scan() {
		line++
		var w Wire
		if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
			return nil, 0, fmt.Errorf("quota: %s:%d is damaged: %w", path, line, err)
		}
		q, err := FromWire("", &w)
		if err != nil {
			return nil, 0, fmt.Errorf("quota: %s:%d: %w", path, line, err)
		}
		q.Tier = in.get([]byte(q.Tier))
		for j := range q.Overrides {
			q.Overrides[j].Descriptor = in.get([]byte(q.Overrides[j].Descriptor))
		}
		out = append(out, q)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("quota: %s:%d: %w", path, line+1, err)
	}
	if len(out) != h.Count {
		return nil, 0, fmt.Errorf("quota: %s is damaged: the header counts %d quotas, the file holds %d", path, h.Count, len(out))
	}
	return out, h.Version, nil
}

func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
