package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var sprayScenario = filepath.Join("..", "..", "simulate", "scenarios", "spray.yaml")

// edgelimit sim --html FILE writes the page there and still prints the
// table; with stderr not a terminal, nothing goes to stderr.
func TestSimHTML(t *testing.T) {
	out := filepath.Join(t.TempDir(), "report.html")
	var stdout, stderr bytes.Buffer
	if err := runSimTo([]string{"--html", out, sprayScenario}, &stdout, &stderr, false); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("<svg")) || !bytes.Contains(page, []byte("edgelimit sim: spray")) {
		t.Fatalf("the page has no chart or no title:\n%.500s", page)
	}
	if !strings.Contains(stdout.String(), "seed 42") {
		t.Fatalf("no table on stdout:\n%s", stdout.String())
	}
	if stderr.Len() != 0 {
		t.Fatalf("stderr is not a terminal, yet got %q", stderr.String())
	}
}

// A --html path that cannot be written fails before the run, naming it.
func TestSimHTMLUnwritable(t *testing.T) {
	out := filepath.Join(t.TempDir(), "no", "such", "dir", "report.html")
	var stdout, stderr bytes.Buffer
	err := runSimTo([]string{"--html", out, sprayScenario}, &stdout, &stderr, false)
	if err == nil || !strings.Contains(err.Error(), "--html") || !strings.Contains(err.Error(), out) {
		t.Fatalf("err %v, want one naming --html and %s", err, out)
	}
	if stdout.Len() != 0 {
		t.Fatalf("ran anyway: %s", stdout.String())
	}
}

// With stderr a terminal, sim draws a bar there and clears it at the end;
// stdout carries only the table.
func TestSimProgress(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := runSimTo([]string{sprayScenario}, &stdout, &stderr, true); err != nil {
		t.Fatal(err)
	}
	e := stderr.String()
	if !strings.HasPrefix(e, "\rsim spray [") || !strings.Contains(e, "% ") || !strings.Contains(e, "s simulated") {
		t.Fatalf("no progress bar on stderr: %q", e)
	}
	last := e[strings.LastIndex(e[:len(e)-1], "\r"):]
	if strings.Trim(last, "\r ") != "" || len(last) < len("\rsim spray [") {
		t.Fatalf("the bar is not cleared at the end: %q", last)
	}
	if strings.Contains(stdout.String(), "\r") {
		t.Fatalf("progress leaked to stdout: %q", stdout.String())
	}
}

// The bar redraws at most once per interval, never goes back, defuses
// control characters in its label and clears exactly what it drew.
func TestProgressThrottle(t *testing.T) {
	if p := newProgress(&bytes.Buffer{}, false, "x"); p != nil {
		t.Fatal("a bar when off")
	}
	var nilBar *progress
	nilBar.update(1, 2) // no bar: no-ops, no panic
	nilBar.finish()

	var w bytes.Buffer
	now := time.Unix(0, 0)
	p := newProgress(&w, true, "sim \x1b[31mred")
	p.now = func() time.Time { return now }
	total := 30 * time.Second

	p.update(0, total) // the first report always draws
	if got, want := w.String(), "\rsim ?[31mred [>                             ]   0%  0.0s of 30.0s simulated"; got != want {
		t.Fatalf("first draw\n got %q\nwant %q", got, want)
	}
	now = now.Add(50 * time.Millisecond)
	p.update(10*time.Second, total)
	if strings.Count(w.String(), "\r") != 1 {
		t.Fatalf("redrawn within 100ms: %q", w.String())
	}
	now = now.Add(60 * time.Millisecond)
	p.update(9*time.Second, total) // late report of another goroutine
	if !strings.HasSuffix(w.String(), "]  33%  10.0s of 30.0s simulated") {
		t.Fatalf("second draw went back or is off: %q", w.String())
	}
	now = now.Add(time.Second)
	p.update(total, total)
	if !strings.HasSuffix(w.String(), "[==============================] 100%  30.0s of 30.0s simulated") {
		t.Fatalf("full bar: %q", w.String())
	}
	drawn := len([]rune(progressLine(p.label, total, total)))
	w.Reset()
	p.finish()
	if got, want := w.String(), "\r"+strings.Repeat(" ", drawn)+"\r"; got != want {
		t.Fatalf("finish wrote %q, want %q", got, want)
	}
	w.Reset()
	p.finish()
	if w.Len() != 0 {
		t.Fatalf("second finish wrote %q", w.String())
	}

	if got := progressLine("x", 5, 0); !strings.Contains(got, "  0%") {
		t.Fatalf("no total: %q", got)
	}
}

// Only a character device counts as a terminal: not a buffer, not a file.
func TestProgressIsTerminal(t *testing.T) {
	if isTerminal(&bytes.Buffer{}) {
		t.Fatal("a buffer is a terminal")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isTerminal(f) {
		t.Fatal("a regular file is a terminal")
	}
	var stdout bytes.Buffer // help goes to stdout (TestHelpGoesToStdout)
	if code := run([]string{"sim", "--help"}, &stdout, &bytes.Buffer{}); code != 0 || !strings.Contains(stdout.String(), "-html") {
		t.Fatalf("sim --help: exit %d, usage does not mention -html: %q", code, stdout.String())
	}
}
