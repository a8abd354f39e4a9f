package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// File is the embedded quota Store of a single PoP, kept under its data
// directory: quotas.json (every quota and the last audit id, rewritten
// atomically on each change) and audit.jsonl (the append-only audit trail,
// one JSON entry per line, synced before the change is acknowledged). It is
// safe for concurrent use within one process; two processes must not share
// a directory.
type File struct {
	dir string

	mu       sync.Mutex
	quotas   map[string]*Quota
	version  int64
	opened   int64      // version at open: the change log starts after it
	log      []logEntry // changes since open
	watchers map[int]func()
	nextW    int
	now      func() time.Time
}

type logEntry struct {
	id  int64
	key string
}

// OpenFile opens (creating) the embedded store in dir.
func OpenFile(dir string) (*File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("quota: %w", err)
	}
	f := &File{dir: dir, quotas: map[string]*Quota{}, watchers: map[int]func(){}, now: time.Now}
	all, v, err := ReadSnapshot(f.statePath())
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		for _, q := range all {
			f.quotas[q.APIKey] = q
		}
		f.version = v
	}
	f.opened = f.version
	return f, nil
}

func (f *File) statePath() string { return filepath.Join(f.dir, "quotas.json") }
func (f *File) auditPath() string { return filepath.Join(f.dir, "audit.jsonl") }

// Close does nothing: every change is on disk when it returns.
func (f *File) Close() {}

// Get returns key's quota, or ErrNotFound.
func (f *File) Get(_ context.Context, key string) (*Quota, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.quotas[key]
	if q == nil {
		return nil, ErrNotFound
	}
	return q.Clone(), nil
}

// write appends the audit entry of key's change from before to after, saves
// the state and tells the watchers. Requires f.mu held.
func (f *File) write(key, actor string, before, after *Quota) error {
	e := AuditEntry{ID: f.version + 1, APIKey: key, Actor: actor, At: f.now().UTC(), Before: before.ToWire(), After: after.ToWire()}
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	af, err := os.OpenFile(f.auditPath(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = af.Write(append(line, '\n'))
	if err == nil {
		err = af.Sync()
	}
	if cerr := af.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if after == nil {
		delete(f.quotas, key)
	} else {
		f.quotas[key] = after
	}
	f.version = e.ID
	f.log = append(f.log, logEntry{e.ID, key})
	all := make([]*Quota, 0, len(f.quotas))
	for _, q := range f.quotas {
		all = append(all, q)
	}
	if err := writeSnapshotJSON(f.statePath(), f.version, all); err != nil {
		return err
	}
	for _, w := range f.watchers {
		w()
	}
	return nil
}

// Put creates or replaces q on behalf of actor.
func (f *File) Put(_ context.Context, q *Quota, actor string) (*Quota, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	before := f.quotas[q.APIKey]
	q.UpdatedAt = TimeOf(f.now())
	q = q.Clone()
	if err := f.write(q.APIKey, actor, before, q); err != nil {
		return nil, fmt.Errorf("quota: put %q: %w", q.APIKey, err)
	}
	return before, nil
}

// Delete removes key's quota on behalf of actor.
func (f *File) Delete(_ context.Context, key, actor string) (*Quota, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	before := f.quotas[key]
	if before == nil {
		return nil, ErrNotFound
	}
	if err := f.write(key, actor, before, nil); err != nil {
		return nil, fmt.Errorf("quota: delete %q: %w", key, err)
	}
	return before, nil
}

// List returns up to limit quotas of tier ("" for all) after key after.
func (f *File) List(_ context.Context, tier, after string, limit int) ([]*Quota, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var keys []string
	for k, q := range f.quotas {
		if k > after && (tier == "" || q.Tier == tier) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	if len(keys) > limit {
		keys = keys[:limit]
	}
	out := make([]*Quota, len(keys))
	for i, k := range keys {
		out[i] = f.quotas[k].Clone()
	}
	return out, nil
}

// Audit returns key's audit entries, newest first.
func (f *File) Audit(_ context.Context, key string, limit int) ([]AuditEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, err := os.ReadFile(f.auditPath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("quota: audit: %w", err)
	}
	var out []AuditEntry
	for i, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if line == "" {
			continue
		}
		var e AuditEntry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("quota: %s:%d: %w", f.auditPath(), i+1, err)
		}
		if e.APIKey == key {
			out = append(out, e)
		}
	}
	slices.Reverse(out)
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// Snapshot returns every quota and the version.
func (f *File) Snapshot(context.Context) ([]*Quota, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]*Quota, 0, len(f.quotas))
	for _, q := range f.quotas {
		out = append(out, q)
	}
	return out, f.version, nil
}

// ChangesSince returns the keys changed after version with their state now.
func (f *File) ChangesSince(_ context.Context, version int64) ([]Change, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if version < f.opened { // before this process's log: everything may have changed
		var out []Change
		for k, q := range f.quotas {
			out = append(out, Change{k, q})
		}
		return out, f.version, nil
	}
	seen := map[string]bool{}
	var out []Change
	for _, e := range f.log {
		if e.id > version && !seen[e.key] {
			seen[e.key] = true
			out = append(out, Change{e.key, f.quotas[e.key]})
		}
	}
	return out, f.version, nil
}

// Watch calls changed after every write until ctx ends.
func (f *File) Watch(ctx context.Context, changed func()) error {
	f.mu.Lock()
	id := f.nextW
	f.nextW++
	f.watchers[id] = changed
	f.mu.Unlock()
	changed()
	<-ctx.Done()
	f.mu.Lock()
	delete(f.watchers, id)
	f.mu.Unlock()
	return nil
}
