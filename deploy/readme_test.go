package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocsFlagTable: every flag of `edgelimit pop --help` has a row in
// docs/running.md's flag table (its first cell names it), and every flag the
// table names exists: the binary's flag set is the one source of truth.
func TestDocsFlagTable(t *testing.T) {
	flags := popFlags(t)
	var table []string
	for _, line := range strings.Split(readRepoFile(t, "docs/running.md"), "\n") {
		if !strings.HasPrefix(line, "| `--") {
			continue
		}
		first := strings.SplitN(line, "|", 3)[1]
		for _, m := range regexp.MustCompile("`--([a-z0-9-]+)`").FindAllStringSubmatch(first, -1) {
			if slices.Contains(table, m[1]) {
				t.Errorf("docs/running.md's flag table has --%s twice", m[1])
			}
			table = append(table, m[1])
		}
	}
	for _, f := range flags {
		if !slices.Contains(table, f) {
			t.Errorf("--%s is in 'edgelimit pop --help' but not in docs/running.md's flag table", f)
		}
	}
	for _, f := range table {
		if !slices.Contains(flags, f) {
			t.Errorf("docs/running.md's flag table names --%s, which 'edgelimit pop --help' does not list", f)
		}
	}
}

// docFiles are the documents whose commands and links the tests check: the
// README, every page of docs/, and the deploy README.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "deploy/README.md"}
	pages, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil || len(pages) == 0 {
		t.Fatalf("no docs/*.md: %v", err)
	}
	for _, p := range pages {
		files = append(files, filepath.ToSlash(strings.TrimPrefix(p, ".."+string(filepath.Separator))))
	}
	return files
}

// docCommands returns every `edgelimit <command> …` a document shows, in a
// code block (continued lines joined) or in a backtick span, as the words
// after "edgelimit".
func docCommands(text string) [][]string {
	var cmds []string
	inBlock := false
	var cont string
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inBlock = !inBlock
			cont = ""
			continue
		}
		if inBlock {
			line = cont + line
			if strings.HasSuffix(strings.TrimSpace(line), `\`) {
				cont = strings.TrimSuffix(strings.TrimSpace(line), `\`) + " "
				continue
			}
			cont = ""
			line, _, _ = strings.Cut(line, "#") // a comment is prose
			if i := strings.Index(line, "edgelimit "); i >= 0 && (i == 0 || strings.ContainsAny(line[i-1:i], " /$(")) {
				cmds = append(cmds, line[i:])
			}
			continue
		}
		for _, m := range regexp.MustCompile("`(edgelimit [^`]+)`").FindAllStringSubmatch(line, -1) {
			cmds = append(cmds, m[1])
		}
	}
	var out [][]string
	for _, c := range cmds {
		for _, sep := range []string{"|", ";", "&&", ">", "<"} {
			c, _, _ = strings.Cut(c, sep)
		}
		words := strings.Fields(c)
		if len(words) > 1 {
			out = append(out, words[1:])
		}
	}
	return out
}

// TestDocsCommandFlags: every flag a document passes to an edgelimit
// command is one that command's --help lists, so no document shows a
// command the binary would refuse.
func TestDocsCommandFlags(t *testing.T) {
	bin := edgelimitBin(t)
	known := map[string][]string{}
	flagsOf := func(cmd string) []string {
		if f, ok := known[cmd]; ok {
			return f
		}
		out, _ := exec.Command(bin, cmd, "--help").CombinedOutput()
		var names []string
		for _, m := range regexp.MustCompile(`(?m)^  -([a-z0-9-]+)`).FindAllStringSubmatch(string(out), -1) {
			names = append(names, m[1])
		}
		known[cmd] = names
		return names
	}
	commands := []string{"pop", "demo", "sim", "load", "probe", "natsconf", "baseline", "version", "help"}
	flagWord := regexp.MustCompile(`^--?([a-z][a-z0-9-]*)(=.*)?$`)
	checked := 0
	for _, file := range docFiles(t) {
		for _, words := range docCommands(readRepoFile(t, file)) {
			cmd := words[0]
			if !slices.Contains(commands, cmd) {
				if !strings.HasPrefix(cmd, "-") && regexp.MustCompile(`^[a-z]+$`).MatchString(cmd) {
					t.Errorf("%s: 'edgelimit %s': no such command", file, strings.Join(words, " "))
				}
				continue
			}
			flags := flagsOf(cmd)
			for _, w := range words[1:] {
				m := flagWord.FindStringSubmatch(w)
				if m == nil || m[1] == "help" || m[1] == "h" {
					continue
				}
				checked++
				if !slices.Contains(flags, m[1]) {
					t.Errorf("%s: 'edgelimit %s' passes %s, which 'edgelimit %s --help' does not list",
						file, strings.Join(words, " "), w, cmd)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked only %d flags of documented commands: the documents were not read as expected", checked)
	}
}

// TestDocsLinks: every relative link of a document names a file of the
// repository, so moving a page cannot leave its readers at a dead end.
func TestDocsLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	for _, file := range docFiles(t) {
		for _, m := range link.FindAllStringSubmatch(readRepoFile(t, file), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path := filepath.Join("..", filepath.Dir(file), target)
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", file, target)
			}
		}
	}
}

// TestREADMEIsShort: the README is the newcomer's page; reference and design
// material belongs in docs/.
func TestREADMEIsShort(t *testing.T) {
	if n := strings.Count(readRepoFile(t, "README.md"), "\n"); n > 300 {
		t.Errorf("README.md has %d lines; keep it at most 300 and move reference material to docs/", n)
	}
}

// TestDocsPurposeLine: every page of docs/ opens with its title and then one
// paragraph saying what the page is for, before any section, so a reader
// knows from its top whether to read on.
func TestDocsPurposeLine(t *testing.T) {
	for _, file := range docFiles(t) {
		if !strings.HasPrefix(file, "docs/") {
			continue
		}
		lines := strings.Split(readRepoFile(t, file), "\n")
		if len(lines) < 3 || !strings.HasPrefix(lines[0], "# ") || strings.TrimSpace(lines[1]) != "" ||
			strings.TrimSpace(lines[2]) == "" || strings.HasPrefix(lines[2], "#") || strings.HasPrefix(lines[2], "```") ||
			strings.HasPrefix(lines[2], "|") {
			t.Errorf("%s does not open with '# title', a blank line and a sentence saying what the page is for", file)
		}
	}
}

// TestDocsNoHistory: the documents describe edgelimit as it is, not how it
// came to be: no issue or pull-request numbers, commit hashes, work sessions
// or work logs (the git history keeps those).
func TestDocsNoHistory(t *testing.T) {
	history := []*regexp.Regexp{
		regexp.MustCompile(`(?i)\b(issue|pull request|PR)s? #?\d+`),
		regexp.MustCompile(`(?:^|[\s(])#\d{1,5}\b`),
		regexp.MustCompile(`(?i)\bwork[- ]?logs?\b`),
		regexp.MustCompile(`(?i)\bsessions?\b`),
		regexp.MustCompile(`(?i)\bcommit [0-9a-f]{7,40}\b`),
		regexp.MustCompile(`\b[0-9a-f]*(?:[0-9][a-f]|[a-f][0-9])[0-9a-f]*\b`), // hex words, filtered to 7–40 below
	}
	files := append(docFiles(t), "deploy/lab/README.md", "deploy/soak/README.md")
	for _, file := range files {
		for n, line := range strings.Split(readRepoFile(t, file), "\n") {
			for _, re := range history {
				for _, m := range re.FindAllString(line, -1) {
					if re == history[len(history)-1] && (len(m) < 7 || len(m) > 40) {
						continue
					}
					t.Errorf("%s:%d: %q is development history; the git history keeps it", file, n+1, m)
				}
			}
		}
	}
}

// TestREADMEContents: the README's table of contents, and every other link
// of it to one of its own sections, lands on a heading (GitHub's anchor:
// lower case, punctuation dropped, spaces as dashes).
func TestREADMEContents(t *testing.T) {
	text := readRepoFile(t, "README.md")
	anchors := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			a := strings.ToLower(strings.ReplaceAll(h, "`", ""))
			a = regexp.MustCompile(`[^a-z0-9 _-]`).ReplaceAllString(a, "")
			anchors[strings.ReplaceAll(a, " ", "-")] = true
		}
	}
	links := regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(text, -1)
	if len(links) < len(anchors) {
		t.Errorf("the README links %d of its own sections, and has %d: its table of contents should name each", len(links), len(anchors))
	}
	for _, m := range links {
		if !anchors[m[1]] {
			t.Errorf("README.md links to #%s, which no section heading makes", m[1])
		}
	}
}
