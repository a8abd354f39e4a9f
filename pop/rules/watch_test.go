package rules

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// watch runs a Watcher of paths with a 20ms interval until the test ends and
// returns the channels its callbacks feed.
func watch(t *testing.T, paths ...string) (<-chan *Set, <-chan error) {
	t.Helper()
	return watchWith(t, false, paths...)
}

// watchWith is watch with the Watcher's AllowEmpty set to allowEmpty.
func watchWith(t *testing.T, allowEmpty bool, paths ...string) (<-chan *Set, <-chan error) {
	t.Helper()
	loads, errs := make(chan *Set, 16), make(chan error, 16)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w := NewWatcher(paths, 20*time.Millisecond, nil)
		w.AllowEmpty = allowEmpty
		w.Run(ctx, func(s *Set, _ []Warning) { loads <- s }, func(err error) { errs <- err })
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return loads, errs
}

// quota returns the requests_per_unit of descriptor k=v in domain d.
func quota(s *Set) int64 {
	ls := s.Domain("d").Match([]Entry{{Key: "k", Value: "v"}})
	if len(ls) != 1 {
		return -1
	}
	return ls[0].Spec.Limit
}

func rulesWith(n int) string {
	return "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: " + strconv.Itoa(n) + "}\n"
}

func nextLoad(t *testing.T, loads <-chan *Set, errs <-chan error) *Set {
	t.Helper()
	select {
	case s := <-loads:
		return s
	case err := <-errs:
		t.Fatalf("onError(%v), want onLoad", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no onLoad within 5s")
	}
	return nil
}

func nextError(t *testing.T, loads <-chan *Set, errs <-chan error) error {
	t.Helper()
	select {
	case s := <-loads:
		t.Fatalf("onLoad with quota %d, want onError", quota(s))
	case err := <-errs:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal("no onError within 5s")
	}
	return nil
}

func wantQuota(t *testing.T, s *Set, want int64) {
	t.Helper()
	if got := quota(s); got != want {
		t.Fatalf("quota = %d, want %d", got, want)
	}
}

func TestWatcher(t *testing.T) {
	t.Run("edit, break, fix", func(t *testing.T) {
		file := writeFile(t, t.TempDir(), "rules.yaml", rulesWith(10))
		loads, errs := watch(t, file)
		wantQuota(t, nextLoad(t, loads, errs), 10)

		writeFile(t, filepath.Dir(file), "rules.yaml", rulesWith(20))
		wantQuota(t, nextLoad(t, loads, errs), 20)

		writeFile(t, filepath.Dir(file), "rules.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, request_per_unit: 30}\n")
		if err := nextError(t, loads, errs); !strings.Contains(err.Error(), "rules.yaml:4:") {
			t.Errorf("error %v does not name rules.yaml:4", err)
		}
		// The bad file is not retried while it stays the same.
		select {
		case s := <-loads:
			t.Fatalf("onLoad with quota %d after a bad file", quota(s))
		case err := <-errs:
			t.Fatalf("onError(%v) again for an unchanged file", err)
		case <-time.After(100 * time.Millisecond):
		}

		writeFile(t, filepath.Dir(file), "rules.yaml", rulesWith(30))
		wantQuota(t, nextLoad(t, loads, errs), 30)
	})

	t.Run("replace by rename", func(t *testing.T) {
		dir := t.TempDir()
		file := writeFile(t, dir, "rules.yaml", rulesWith(10))
		loads, errs := watch(t, file)
		wantQuota(t, nextLoad(t, loads, errs), 10)

		tmp := writeFile(t, dir, ".rules.yaml.swp", rulesWith(11))
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
		wantQuota(t, nextLoad(t, loads, errs), 11)
	})

	t.Run("configmap symlink swap", func(t *testing.T) {
		dir := t.TempDir()
		for _, v := range []string{"..v1", "..v2"} {
			if err := os.Mkdir(filepath.Join(dir, v), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		writeFile(t, dir, "..v1/rules.yaml", rulesWith(10))
		writeFile(t, dir, "..v2/rules.yaml", rulesWith(12))
		if err := os.Symlink("..v1", filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("..data/rules.yaml", filepath.Join(dir, "rules.yaml")); err != nil {
			t.Fatal(err)
		}
		loads, errs := watch(t, dir)
		wantQuota(t, nextLoad(t, loads, errs), 10)

		// What the kubelet does: a new ..data link renamed over the old one.
		if err := os.Symlink("..v2", filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
		wantQuota(t, nextLoad(t, loads, errs), 12)
	})

	t.Run("files appear and disappear", func(t *testing.T) {
		dir := t.TempDir()
		writeFile(t, dir, "d.yaml", rulesWith(10))
		loads, errs := watch(t, dir)
		if s := nextLoad(t, loads, errs); len(s.Domains()) != 1 {
			t.Fatalf("%d domains, want 1", len(s.Domains()))
		}
		other := writeFile(t, dir, "e.yaml", "domain: e\n")
		if s := nextLoad(t, loads, errs); len(s.Domains()) != 2 || s.Domain("e") == nil {
			t.Fatalf("domains %v, want d and e", s.Domains())
		}
		if err := os.Remove(other); err != nil {
			t.Fatal(err)
		}
		if s := nextLoad(t, loads, errs); len(s.Domains()) != 1 || s.Domain("e") != nil {
			t.Fatalf("domains %v, want d alone", s.Domains())
		}
		// A watched file that disappears is an error; the last good set stays.
		file := filepath.Join(dir, "d.yaml")
		loads2, errs2 := watch(t, file)
		nextLoad(t, loads2, errs2)
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		if err := nextError(t, loads2, errs2); !strings.Contains(err.Error(), file) {
			t.Errorf("error %v does not name %s", err, file)
		}
		writeFile(t, dir, "d.yaml", rulesWith(13))
		wantQuota(t, nextLoad(t, loads2, errs2), 13)
	})
}

// Emptying a rules directory must not turn into "allow everything": the
// reload is an error (ErrNoLimits) and the caller keeps its last good rules,
// unless the watcher was told empty rule sets are intended.
func TestWatcherRejectsEmptyRules(t *testing.T) {
	t.Run("emptied directory", func(t *testing.T) {
		dir := t.TempDir()
		file := writeFile(t, dir, "rules.yaml", rulesWith(10))
		loads, errs := watch(t, dir)
		wantQuota(t, nextLoad(t, loads, errs), 10)
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		if err := nextError(t, loads, errs); !errors.Is(err, ErrNoLimits) {
			t.Fatalf("error %v, want ErrNoLimits", err)
		}
		writeFile(t, dir, "rules.yaml", rulesWith(11))
		wantQuota(t, nextLoad(t, loads, errs), 11)
	})
	t.Run("file with a domain and no limits", func(t *testing.T) {
		file := writeFile(t, t.TempDir(), "rules.yaml", rulesWith(10))
		loads, errs := watch(t, file)
		wantQuota(t, nextLoad(t, loads, errs), 10)
		writeFile(t, filepath.Dir(file), "rules.yaml", "domain: d\n")
		if err := nextError(t, loads, errs); !errors.Is(err, ErrNoLimits) {
			t.Fatalf("error %v, want ErrNoLimits", err)
		}
	})
	t.Run("allowed", func(t *testing.T) {
		dir := t.TempDir()
		file := writeFile(t, dir, "rules.yaml", rulesWith(10))
		loads, errs := watchWith(t, true, dir)
		wantQuota(t, nextLoad(t, loads, errs), 10)
		if err := os.Remove(file); err != nil {
			t.Fatal(err)
		}
		if s := nextLoad(t, loads, errs); len(s.Limits()) != 0 {
			t.Fatalf("%d limits, want none", len(s.Limits()))
		}
	})
}

// Entries of a rules directory that are not regular files — a directory, a
// FIFO, a socket, a dangling symlink, all named like rule files — are skipped
// with a warning naming them; Load neither fails nor blocks on them.
func TestLoadSkipsNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "good.yaml", rulesWith(7))
	if err := os.Mkdir(filepath.Join(dir, "adir.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "missing"), filepath.Join(dir, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}
	// A Unix socket path must be short: make it in a short temporary directory.
	sockDir, err := os.MkdirTemp("", "el")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	ln, err := net.Listen("unix", filepath.Join(sockDir, "s.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if err := os.Symlink(filepath.Join(sockDir, "s.yaml"), filepath.Join(dir, "sock.yaml")); err != nil {
		t.Fatal(err)
	}

	type result struct {
		set   *Set
		warns []Warning
		err   error
	}
	done := make(chan result, 1)
	go func() {
		s, w, err := Load(dir)
		done <- result{s, w, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Load blocked on a non-regular file")
	}
	if r.err != nil {
		t.Fatalf("Load: %v", r.err)
	}
	if got := quota(r.set); got != 7 {
		t.Fatalf("quota %d, want 7 from good.yaml", got)
	}
	var text []string
	for _, w := range r.warns {
		text = append(text, w.String())
	}
	all := strings.Join(text, "\n")
	for _, name := range []string{"fifo.yaml", "dangling.yaml", "sock.yaml"} {
		if !strings.Contains(all, name) {
			t.Errorf("no warning names %s; warnings:\n%s", name, all)
		}
	}

	// The watcher skips them the same way.
	loads, errs := watch(t, dir)
	wantQuota(t, nextLoad(t, loads, errs), 7)
}

// A change is noticed from the files' metadata, within a few StatIntervals,
// not at the next full read: with the full read an hour away, edits, a
// replacement by rename and a new file in a watched directory all load.
func TestWatcherNoticesChangesFromMetadata(t *testing.T) {
	dir := t.TempDir()
	file := writeFile(t, dir, "rules.yaml", rulesWith(10))
	loads, errs := make(chan *Set, 16), make(chan error, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w := NewWatcher([]string{dir}, time.Hour, nil)
		w.StatInterval = 10 * time.Millisecond
		w.Run(ctx, func(s *Set, _ []Warning) { loads <- s }, func(err error) { errs <- err })
	}()
	t.Cleanup(func() { cancel(); <-done })
	wantQuota(t, nextLoad(t, loads, errs), 10)

	writeFile(t, dir, "rules.yaml", rulesWith(20))
	wantQuota(t, nextLoad(t, loads, errs), 20)

	tmp := writeFile(t, dir, ".rules.yaml.tmp", rulesWith(21))
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
	wantQuota(t, nextLoad(t, loads, errs), 21)

	writeFile(t, dir, "e.yaml", "domain: e\n")
	if s := nextLoad(t, loads, errs); s.Domain("e") == nil {
		t.Fatalf("domains %v, want e among them", s.Domains())
	}
}
