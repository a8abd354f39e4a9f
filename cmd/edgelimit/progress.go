package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
)

// isTerminal reports whether w is a terminal (a character device), the only
// place a progress bar redrawn with \r belongs.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progress draws a one-line progress bar of simulated time on w, redrawn in
// place with \r at most once per every. Its methods are safe for concurrent
// use, and a nil *progress draws nothing.
type progress struct {
	w     io.Writer
	label string
	every time.Duration
	now   func() time.Time

	mu    sync.Mutex
	last  time.Time     // when the bar was last drawn
	done  time.Duration // the most done reported so far
	drawn int           // length of the line on screen, 0 when none
}

// progressWidth is the number of cells between the bar's brackets.
const progressWidth = 30

// newProgress returns a bar labelled label drawing on w when on, and nil
// (no bar) otherwise.
func newProgress(w io.Writer, on bool, label string) *progress {
	if !on {
		return nil
	}
	return &progress{w: w, label: printable(label), every: 100 * time.Millisecond, now: time.Now}
}

// printable replaces control characters, so that a scenario's name cannot
// move the cursor or change colours.
func printable(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return '?'
	}, s)
}

// update is a simulate.Options.Progress: it redraws the bar unless it was
// drawn less than every ago.
func (p *progress) update(done, total time.Duration) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// Reports from concurrent runs may arrive out of order: never go back.
	p.done = max(p.done, done)
	now := p.now()
	if p.drawn > 0 && now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	line := progressLine(p.label, p.done, total)
	n := len([]rune(line))
	pad := ""
	if n < p.drawn { // cover what is left of a longer line
		pad = strings.Repeat(" ", p.drawn-n)
	}
	fmt.Fprintf(p.w, "\r%s%s", line, pad)
	p.drawn = max(n, p.drawn)
}

// finish clears the bar, leaving the cursor at the start of an empty line.
func (p *progress) finish() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn > 0 {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.drawn))
		p.drawn = 0
	}
}

// progressLine renders "label [=====>    ] 62%  18.6s of 30.0s simulated".
func progressLine(label string, done, total time.Duration) string {
	frac := 0.0
	if total > 0 {
		frac = min(max(float64(done)/float64(total), 0), 1)
	}
	filled := int(frac * progressWidth)
	bar := strings.Repeat("=", filled)
	if filled < progressWidth {
		bar += ">" + strings.Repeat(" ", progressWidth-filled-1)
	}
	return fmt.Sprintf("%s [%s] %3d%%  %.1fs of %.1fs simulated",
		label, bar, int(frac*100), done.Seconds(), total.Seconds())
}
