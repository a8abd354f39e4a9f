// Command testlog reads `go test -json` on stdin and prints what `go test`
// prints without -v — each package's ok or FAIL line, build errors, and the
// output of the tests that failed — plus one line for every skipped test
// with its reason, which plain `go test` hides. It exits 1 if any test,
// package or build failed, or if a package that started never reported a
// result (a crash or a timeout prints its output).
//
//	go test -json ./... | go run ./cmd/testlog
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json), or of the build
// output it carries (Action build-output / build-fail, with ImportPath).
type event struct {
	Action     string
	Package    string
	ImportPath string
	Test       string
	Output     string
	Elapsed    float64
}

// pkg is what one package printed, in order, until its result.
type pkg struct {
	lines []line
	done  map[string]bool // tests that passed or were skipped: not printed on failure
	skips []string
}

type line struct{ test, text string }

func main() {
	os.Exit(run(os.Stdin, os.Stdout))
}

func run(in io.Reader, out io.Writer) int {
	pkgs := map[string]*pkg{}
	var order []string // packages in the order they started, for the unfinished
	get := func(name string) *pkg {
		p := pkgs[name]
		if p == nil {
			p = &pkg{done: map[string]bool{}}
			pkgs[name] = p
			order = append(order, name)
		}
		return p
	}
	failed := false
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		raw := sc.Bytes()
		var e event
		if err := json.Unmarshal(raw, &e); err != nil || e.Action == "" {
			fmt.Fprintln(out, string(raw)) // not test2json: go's own error, say
			continue
		}
		switch e.Action {
		case "build-output":
			fmt.Fprint(out, e.Output)
			continue
		case "build-fail":
			failed = true
			continue
		}
		p := get(e.Package)
		switch e.Action {
		case "output":
			p.lines = append(p.lines, line{e.Test, e.Output})
		case "skip":
			if e.Test != "" {
				p.skips = append(p.skips, fmt.Sprintf("--- SKIP: %s: %s", e.Test, reason(p.lines, e.Test)))
				p.done[e.Test] = true
			}
		case "pass":
			if e.Test != "" {
				p.done[e.Test] = true
				continue
			}
			printSkips(out, p)
			fmt.Fprintf(out, "ok  \t%s\t%.3fs\n", e.Package, e.Elapsed)
			delete(pkgs, e.Package)
		case "fail":
			failed = true
			if e.Test != "" {
				continue
			}
			printSkips(out, p)
			printFailed(out, p)
			delete(pkgs, e.Package)
		}
	}
	for _, name := range order {
		p := pkgs[name]
		if p == nil {
			continue
		}
		if !noTests(p) {
			failed = true // started and never said how it ended
		}
		printFailed(out, p)
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(out, "testlog:", err)
		return 1
	}
	if failed {
		return 1
	}
	return 0
}

func printSkips(out io.Writer, p *pkg) {
	for _, s := range p.skips {
		fmt.Fprintln(out, s)
	}
}

// printFailed prints a package's output but that of its tests that passed
// or were skipped (and their subtests').
func printFailed(out io.Writer, p *pkg) {
	for _, l := range p.lines {
		if l.test != "" && passed(p, l.test) {
			continue
		}
		fmt.Fprint(out, l.text)
	}
}

func passed(p *pkg, test string) bool {
	for {
		if p.done[test] {
			return true
		}
		i := strings.LastIndexByte(test, '/')
		if i < 0 {
			return false
		}
		test = test[:i]
	}
}

// noTests reports whether a package without a result is one go test
// reported as having no test files.
func noTests(p *pkg) bool {
	for _, l := range p.lines {
		if strings.HasPrefix(l.text, "?") && strings.Contains(l.text, "[no test files]") {
			return true
		}
	}
	return false
}

// reason is what a skipped test logged: t.Skip's message, without the
// "=== RUN" and "--- SKIP" lines test2json passes through.
func reason(lines []line, test string) string {
	var rs []string
	for _, l := range lines {
		if l.test != test {
			continue
		}
		t := strings.TrimSpace(l.text)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		rs = append(rs, t)
	}
	if len(rs) == 0 {
		return "(no reason given)"
	}
	return strings.Join(rs, " ")
}
