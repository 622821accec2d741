package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Docs that run: README.md and docs/*.md are checked against the code.
//
//   - Every ```toml block passes `changegate check`. A block that is not a
//     whole configuration is marked with the line <!-- fragment --> right
//     before it: it is checked appended to a minimal configuration (a
//     [mongo] table and an "orders" source on shop.orders, each left out
//     when the fragment has its own). A block that must not be checked
//     (none today) would be marked <!-- not-checked -->.
//   - Every flag named after "changegate COMMAND" (in code blocks and
//     inline code) is a flag of that command, and every inline `-flag` is a
//     flag of some command.
//   - Every relative link and image resolves to a file of the repository,
//     and its #anchor to a heading of the page.
//   - Every ```go block builds against the repository's packages, and every
//     ```js and ```python block parses (when node and python3 are
//     installed); TestDocsNodeReceiver (CHANGEGATE_NODE_COMPAT=1) runs the
//     README's Node.js receiver against requests signed as changegate signs.

// docFiles are the documentation pages, relative to the repository root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CHANGELOG.md"}
	pages, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pages {
		files = append(files, strings.TrimPrefix(p, "../../"))
	}
	if len(files) < 10 {
		t.Fatalf("found %d documentation pages, want README.md and docs/*.md", len(files))
	}
	return files
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("../..", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// block is one fenced code block.
type block struct {
	lang, text, marker string
	line               int
}

var fenceRE = regexp.MustCompile("^```([a-z]*)\\s*$")

// splitDoc returns the fenced blocks of a page and its prose (the lines
// outside fences, with inline code kept).
func splitDoc(doc string) (blocks []block, prose []string) {
	lines := strings.Split(doc, "\n")
	var cur *block
	var body []string
	for i, line := range lines {
		m := fenceRE.FindStringSubmatch(line)
		switch {
		case cur == nil && m != nil:
			cur = &block{lang: m[1], line: i + 1}
			for j := i - 1; j >= 0; j-- {
				if s := strings.TrimSpace(lines[j]); s != "" {
					if strings.HasPrefix(s, "<!--") {
						cur.marker = strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(s, "<!--"), "-->"))
					}
					break
				}
			}
			body = nil
		case cur != nil && strings.HasPrefix(line, "```"):
			cur.text = strings.Join(body, "\n") + "\n"
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			body = append(body, line)
		default:
			prose = append(prose, line)
		}
	}
	return blocks, prose
}

// docEnv is the environment the documented configs are checked with.
var docEnv = map[string]string{
	"MONGODB_URI":            "mongodb://mongo:27017/?replicaSet=rs0",
	"BILLING_WEBHOOK_SECRET": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
	"WEBHOOK_SECRET":         "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
	"CHANGEGATE_ADMIN_TOKEN": "0123456789abcdef0123456789abcdef",
	"REDACT_KEY":             "0123456789abcdef0123456789abcdef",
	"PARTNER_TOKEN":          "partner-token",
}

const fragmentBase = `[mongo]
uri = "${MONGODB_URI}"
`

const fragmentSource = `
[[sources]]
name = "orders"
database = "shop"
collection = "orders"
`

var tomlHeaderRE = regexp.MustCompile(`(?m)^\s*\[\[?([a-z_.]+)\]\]?\s*$`)

// fragmentConfig embeds a fragment in a minimal configuration.
func fragmentConfig(frag string) string {
	has := map[string]bool{}
	for _, m := range tomlHeaderRE.FindAllStringSubmatch(frag, -1) {
		has[m[1]] = true
	}
	var b strings.Builder
	if !has["mongo"] {
		b.WriteString(fragmentBase)
	}
	if !has["sources"] {
		b.WriteString(fragmentSource)
	}
	b.WriteString("\n" + frag)
	return b.String()
}

func TestDocsConfigsPassCheck(t *testing.T) {
	for k, v := range docEnv {
		t.Setenv(k, v)
	}
	dir := t.TempDir()
	checked := 0
	for _, name := range docFiles(t) {
		blocks, _ := splitDoc(readDoc(t, name))
		for _, b := range blocks {
			if b.lang != "toml" {
				continue
			}
			text := b.text
			switch b.marker {
			case "":
			case "fragment":
				text = fragmentConfig(text)
			case "not-checked":
				continue
			default:
				t.Errorf("%s:%d: unknown marker <!-- %s --> before a toml block (want fragment or not-checked)", name, b.line, b.marker)
				continue
			}
			file := filepath.Join(dir, fmt.Sprintf("%s-%d.toml", strings.NewReplacer("/", "_", ".", "_").Replace(name), b.line))
			if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			var out, errOut bytes.Buffer
			if code := run([]string{"check", "-config", file}, &out, &errOut); code != 0 {
				kind := "config"
				if b.marker == "fragment" {
					kind = "fragment (checked inside a minimal config: [mongo] and source orders)"
				}
				t.Errorf("%s:%d: the toml %s does not pass changegate check (exit %d):\n%s\n--- checked:\n%s", name, b.line, kind, code, errOut.String(), text)
			}
			checked++
		}
	}
	if checked < 5 {
		t.Errorf("checked %d toml blocks; the docs have more than that", checked)
	}
}

// commandFlags returns the flags of each command, read from its -help.
func commandFlags(t *testing.T) map[string][]string {
	t.Helper()
	flagLine := regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`)
	out := map[string][]string{}
	for _, args := range [][]string{
		{"run"}, {"check"}, {"deadletters", "list"}, {"deadletters", "show"}, {"deadletters", "replay"},
		{"deadletters", "purge"}, {"checkpoints", "show"}, {"checkpoints", "reset"}, {"backfill"},
		{"rules", "test"}, {"tail"}, {"events", "show"}, {"events", "redeliver"}, {"deliveries", "list"}, {"sinks", "redeliver"},
		{"subscriptions", "list"}, {"subscriptions", "create"}, {"subscriptions", "pause"}, {"subscriptions", "rotate-secret"}, {"subscriptions", "show"},
	} {
		var o, e bytes.Buffer
		run(append(slices.Clone(args), "-help"), &o, &e)
		found := flagLine.FindAllStringSubmatch(o.String()+e.String(), -1)
		if len(found) == 0 {
			t.Fatalf("changegate %s -help lists no flags:\n%s%s", strings.Join(args, " "), o.String(), e.String())
		}
		for _, m := range found {
			if !slices.Contains(out[args[0]], m[1]) {
				out[args[0]] = append(out[args[0]], m[1])
			}
		}
	}
	return out
}

var (
	inlineCodeRE = regexp.MustCompile("`([^`]+)`")
	flagTokenRE  = regexp.MustCompile(`^[\[(]?--?([a-z][a-z0-9-]*)`)
	// notChangegateFlags are flags of other programs the docs write alone
	// in inline code: the demo's -stay, go's -race and -trimpath, docker
	// build's --target.
	notChangegateFlags = []string{"stay", "race", "trimpath", "target"}
)

// checkCommandLine checks the flags after each "changegate COMMAND" of s.
func checkCommandLine(t *testing.T, where, s string, flags map[string][]string) {
	fields := strings.Fields(s)
	for i, f := range fields {
		if strings.TrimPrefix(f, "./") != "changegate" || i > 0 && strings.HasPrefix(fields[i-1], "-") {
			continue
		}
		if i+1 >= len(fields) {
			continue
		}
		cmd := fields[i+1]
		rest := fields[i+2:]
		if strings.HasPrefix(cmd, "-") {
			cmd, rest = "run", fields[i+1:]
		}
		known, ok := flags[cmd]
		if !ok {
			continue
		}
		for _, tok := range rest {
			if tok == "|" || tok == "&&" || tok == ">" || strings.HasPrefix(tok, "#") {
				break
			}
			m := flagTokenRE.FindStringSubmatch(tok)
			if m == nil {
				continue
			}
			if !slices.Contains(known, m[1]) {
				t.Errorf("%s: changegate %s has no flag -%s (its flags: -%s)", where, cmd, m[1], strings.Join(known, " -"))
			}
		}
	}
}

func TestDocsNameRealFlags(t *testing.T) {
	flags := commandFlags(t)
	var all []string
	for _, fs := range flags {
		all = append(all, fs...)
	}
	for _, name := range docFiles(t) {
		blocks, prose := splitDoc(readDoc(t, name))
		for _, b := range blocks {
			if b.lang != "sh" && b.lang != "" {
				continue
			}
			for i, line := range strings.Split(b.text, "\n") {
				checkCommandLine(t, fmt.Sprintf("%s:%d", name, b.line+1+i), line, flags)
			}
		}
		for _, line := range prose {
			for _, m := range inlineCodeRE.FindAllStringSubmatch(line, -1) {
				code := m[1]
				checkCommandLine(t, name+": `"+code+"`", code, flags)
				fs := strings.Fields(code)
				if len(fs) == 0 || len(fs) > 2 {
					continue
				}
				if fm := flagTokenRE.FindStringSubmatch(fs[0]); fm != nil && strings.HasPrefix(fs[0], "-") &&
					!slices.Contains(all, fm[1]) && !slices.Contains(notChangegateFlags, fm[1]) {
					t.Errorf("%s: `%s` names a flag no changegate command has", name, code)
				}
			}
		}
	}
}

var (
	linkRE    = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)\)`)
	headingRE = regexp.MustCompile(`^#{1,6}\s+(.*)$`)
)

// anchors returns the GitHub anchors of a page's headings.
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	blocks, prose := splitDoc(doc)
	_ = blocks
	for _, line := range prose {
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		a := b.String()
		for n := 1; out[a]; n++ {
			a = fmt.Sprintf("%s-%d", b.String(), n)
		}
		out[a] = true
	}
	return out
}

func TestDocsLinksResolve(t *testing.T) {
	for _, name := range docFiles(t) {
		doc := readDoc(t, name)
		_, prose := splitDoc(doc)
		for _, line := range prose {
			line = inlineCodeRE.ReplaceAllString(line, "")
			for _, m := range linkRE.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				file := name
				if path != "" {
					file = filepath.ToSlash(filepath.Join(filepath.Dir(name), path))
				}
				if _, err := os.Stat(filepath.Join("../..", file)); err != nil {
					t.Errorf("%s: link %s: %s does not exist", name, target, file)
					continue
				}
				if anchor == "" {
					continue
				}
				if !strings.HasSuffix(file, ".md") {
					t.Errorf("%s: link %s: an anchor into a file that is not a page", name, target)
					continue
				}
				if !anchors(readDoc(t, file))[anchor] {
					t.Errorf("%s: link %s: %s has no heading with anchor #%s", name, target, file, anchor)
				}
			}
		}
	}
}

// snippetPrelude wraps a Go block that is not a whole file: the imports
// the docs' snippets use, each used once so that none is unused.
const snippetPrelude = `package main

import (
	"encoding/json"
	"fmt"
	"log"
	"net/http"
	"os"

	"github.com/changegate/changegate/receive"
)

var (
	_ = json.Marshal
	_ = fmt.Sprint
	_ = log.Print
	_ = http.StatusOK
	_ = os.Getenv
	_ = receive.StatusFor
)

func main() {
`

// TestDocsCodeCompiles builds every ```go block of the docs (a block
// without a package clause is the body of a main function with the
// imports of snippetPrelude) against the repository's packages, and
// parses every ```js block (node --check) and ```python block when node
// and python3 are installed. TestDocsNodeReceiver runs the README's js
// block.
func TestDocsCodeCompiles(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	replace := map[string]string{}
	var pkgs []string
	python, _ := exec.LookPath("python3")
	node, _ := exec.LookPath("node")
	for _, name := range docFiles(t) {
		blocks, _ := splitDoc(readDoc(t, name))
		for _, b := range blocks {
			switch b.lang {
			case "go":
				src := b.text
				if !strings.HasPrefix(strings.TrimSpace(src), "package ") {
					src = snippetPrelude + src + "}\n"
				}
				n := len(pkgs)
				file := filepath.Join(dir, fmt.Sprintf("snippet%d.go", n))
				if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
					t.Fatal(err)
				}
				// A package that exists only in the overlay, inside the
				// module so that it imports the repository's packages.
				pkg := fmt.Sprintf("./internal/docsnippet/s%d", n)
				replace[filepath.Join(root, pkg, "main.go")] = file
				pkgs = append(pkgs, pkg)
				t.Logf("%s:%d is %s", name, b.line, pkg)
			case "js":
				if node == "" {
					continue
				}
				file := filepath.Join(dir, fmt.Sprintf("snippet%d.mjs", len(pkgs)))
				if err := os.WriteFile(file, []byte(b.text), 0o600); err != nil {
					t.Fatal(err)
				}
				if out, err := exec.Command(node, "--check", file).CombinedOutput(); err != nil {
					t.Errorf("%s:%d: the js block does not parse: %v\n%s", name, b.line, err, out)
				}
			case "python":
				if python == "" {
					continue
				}
				cmd := exec.Command(python, "-c", "import ast, sys; ast.parse(sys.stdin.read())")
				cmd.Stdin = strings.NewReader(b.text)
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Errorf("%s:%d: the python block does not parse: %v\n%s", name, b.line, err, out)
				}
			}
		}
	}
	if len(pkgs) == 0 {
		t.Fatal("no go block in the docs; the README has one")
	}
	overlay, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	overlayFile := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlayFile, overlay, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range pkgs {
		cmd := exec.Command(goCmd, "build", "-overlay", overlayFile, "-o", os.DevNull, pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("the go block %s (see the log above for its page) does not build: %v\n%s", pkg, err, out)
		}
	}
}
