package rules

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// DefaultWatchInterval is how often a Watcher reads its files when given no
// interval: the backstop for a change their metadata does not show.
const DefaultWatchInterval = time.Second

// DefaultStatInterval is how often a Watcher looks at its files' metadata
// when Watcher.StatInterval is 0.
const DefaultStatInterval = 50 * time.Millisecond

// Watcher reloads rule files when they change. It polls rather than using
// file system notifications, on two clocks. Every StatInterval it looks at
// the files' metadata only: it lists the paths as Load does and stats each
// directory and rule file (following symlinks: name, size, modification
// time, inode), a few system calls a file. Every interval, and at once when
// the metadata changed, it reads every rule file and hashes the names and
// contents. A file that appears, disappears or changes changes the hash,
// however the change was made — written in place, replaced by an editor's
// rename, or swapped in by a Kubernetes ConfigMap update (which re-points the
// ..data symlink); the metadata shows nearly every such change at once, and
// the interval's read catches one it does not (a rewrite of the same size
// within the file system's timestamp granularity).
//
// When the hash changes, the watcher reads again at each look until the
// files read the same twice in a row, at least StatInterval apart, so that a
// write in progress is not mistaken for a broken or truncated file; then it
// loads exactly the bytes it hashed. A change therefore takes effect within
// about two StatIntervals, or two intervals for one the metadata misses.
//
// A Watcher never calls onLoad with a bad rule set: when a load fails, the
// caller's last good Set stays in force until the files change again and
// load. A rule set without a single limit (an emptied directory, files whose
// domains have no limits) counts as bad — it would admit every request —
// unless AllowEmpty is set.
type Watcher struct {
	// AllowEmpty lets a rule set without limits load. Set it before Run.
	AllowEmpty bool
	// Options are how the files load (merging domains). Set them before Run.
	Options Options
	// Check, when set, refuses a loaded rule set the PoP cannot serve (its
	// error is reported and the last good rules stay). Set it before Run.
	Check func(*Set) error
	// StatInterval is how often the files' metadata is looked at; 0 means
	// DefaultStatInterval, and it is never longer than the interval. Set it
	// before Run.
	StatInterval time.Duration

	paths    []string
	interval time.Duration
	logger   *slog.Logger
}

// ErrNoLimits is the error (wrapped) of a load whose rule set has no limits,
// when that is not allowed: an emptied rules directory would otherwise admit
// every request.
var ErrNoLimits = errors.New("rules: the rule set has no limits (every request would be allowed); refusing it")

// CheckNotEmpty returns an error wrapping ErrNoLimits when set has no
// limits, and nil otherwise.
func CheckNotEmpty(set *Set) error {
	if len(set.Limits()) > 0 {
		return nil
	}
	return fmt.Errorf("%w (%d domains, 0 limits)", ErrNoLimits, len(set.domains))
}

// NewWatcher returns a Watcher of paths (files or directories, as for Load)
// that polls every interval; an interval <= 0 means DefaultWatchInterval and
// a nil logger discards.
func NewWatcher(paths []string, interval time.Duration, logger *slog.Logger) *Watcher {
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Watcher{paths: append([]string(nil), paths...), interval: interval, logger: logger}
}

// Run polls until ctx is done. It checks at once, so the first onLoad (or
// onError) comes without waiting an interval; after that it calls onLoad with
// the new Set and its warnings whenever the files change and load, and
// onError with the error whenever they change and do not (the caller logs
// it). A failure to read the files counts as a change that fails to load.
// The callbacks run on Run's goroutine, one at a time.
func (w *Watcher) Run(ctx context.Context, onLoad func(*Set, []Warning), onError func(error)) {
	look := w.StatInterval
	if look <= 0 {
		look = DefaultStatInterval
	}
	look = min(look, w.interval)
	t := time.NewTicker(look)
	defer t.Stop()
	var last, seen [sha256.Size]byte
	var meta uint64
	first, pending := true, false
	nextRead := time.Now()
	for {
		now := time.Now()
		m := metadata(w.paths)
		if first || pending || m != meta || !now.Before(nextRead) {
			meta, nextRead = m, now.Add(w.interval)
			files, warns, readErr := readFiles(w.paths)
			sum := fingerprint(files, readErr)
			// A change is acted on once the files read the same on two
			// looks in a row: a file written in place can be read
			// half-written (even empty), and that torn read must not be
			// reported as a broken rule file, nor loaded as a short one.
			if first || (sum != last && sum == seen) {
				first, last = false, sum
				w.load(files, warns, readErr, onLoad, onError)
			}
			seen, pending = sum, sum != last
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// metadata hashes what stat says of paths and of the rule files in the
// directories among them: a cheap look that changes with nearly every change
// of the files (see Watcher). Errors are hashed too, so that a path that
// appears or disappears changes it.
func metadata(paths []string) uint64 {
	var h maphash.Hash
	h.SetSeed(metaSeed)
	stat := func(p string) os.FileInfo {
		h.WriteString(p)
		fi, err := os.Stat(p)
		if err != nil {
			h.WriteString(err.Error())
			return nil
		}
		var b [8 * 4]byte
		binary.LittleEndian.PutUint64(b[0:], uint64(fi.Size()))
		binary.LittleEndian.PutUint64(b[8:], uint64(fi.ModTime().UnixNano()))
		binary.LittleEndian.PutUint64(b[16:], uint64(fi.Mode()))
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			binary.LittleEndian.PutUint64(b[24:], st.Ino)
		}
		h.Write(b[:])
		return fi
	}
	for _, p := range paths {
		fi := stat(p)
		if fi == nil || !fi.IsDir() {
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			h.WriteString(err.Error())
			continue
		}
		for _, e := range entries {
			if n := e.Name(); !strings.HasPrefix(n, ".") && (strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
				stat(filepath.Join(p, n))
			}
		}
	}
	return h.Sum64()
}

// metaSeed seeds metadata's hash: one seed for the process, so that hashes
// compare.
var metaSeed = maphash.MakeSeed()

func (w *Watcher) load(files []ruleFile, warns []Warning, readErr error, onLoad func(*Set, []Warning), onError func(error)) {
	if readErr != nil {
		onError(readErr)
		return
	}
	set, more, err := build(files, w.Options)
	if err != nil {
		onError(err)
		return
	}
	warns = append(warns, more...)
	if w.Check != nil {
		if err := w.Check(set); err != nil {
			onError(err)
			return
		}
	}
	if !w.AllowEmpty {
		if err := CheckNotEmpty(set); err != nil {
			for _, wn := range warns { // they may say why (a directory without rule files)
				w.logger.Warn("rules: " + wn.String())
			}
			onError(err)
			return
		}
	}
	w.logger.Info("rules loaded", "files", len(files), "domains", len(set.domains), "limits", len(set.Limits()), "warnings", len(warns))
	onLoad(set, warns)
}

// fingerprint hashes the names and contents of files, or the read error.
func fingerprint(files []ruleFile, readErr error) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	put := func(b []byte) {
		h.Write(binary.BigEndian.AppendUint64(n[:0], uint64(len(b))))
		h.Write(b)
	}
	if readErr != nil {
		put([]byte("error"))
		put([]byte(readErr.Error()))
	}
	for _, f := range files {
		put([]byte(f.name))
		put(f.data)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
