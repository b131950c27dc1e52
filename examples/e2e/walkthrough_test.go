package e2e

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The walkthrough's files: the README's "Your own services in the mesh"
// quotes each of them, and runs them with its commands.
const walkthroughDir = "../walkthrough"

// walkthrough is the README's walkthrough section: each quoted file's
// path (the backquoted path that ends the line before its block) and
// text, and the commands of its bash blocks.
type walkthrough struct {
	files    map[string]string
	commands []string
}

func readWalkthrough(t *testing.T) walkthrough {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(data), "\n## Your own services in the mesh\n")
	require.True(t, ok, "the README has no walkthrough section")
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	w := walkthrough{files: map[string]string{}}
	pathRe := regexp.MustCompile("`([a-z./]+)`:$")
	lines := strings.Split(section, "\n")
	for i := 0; i < len(lines); i++ {
		lang, ok := strings.CutPrefix(lines[i], "```")
		if !ok || lang == "" {
			continue
		}
		var block []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			block = append(block, lines[i])
		}
		if lang == "bash" {
			cur := ""
			for _, l := range block {
				l, _, _ = strings.Cut(l, "  #") // a trailing comment
				if l = strings.TrimSpace(l); strings.HasSuffix(l, `\`) {
					cur += strings.TrimSuffix(l, `\`)
					continue
				}
				if l = strings.TrimSpace(cur + l); l != "" {
					w.commands = append(w.commands, l)
				}
				cur = ""
			}
			continue
		}
		prev := i - len(block) - 2 // the last line with text before the block
		for prev > 0 && strings.TrimSpace(lines[prev]) == "" {
			prev--
		}
		m := pathRe.FindStringSubmatch(strings.TrimSpace(lines[prev]))
		require.NotNil(t, m, "the README's %s block after %q names no file", lang, lines[prev])
		w.files[m[1]] = strings.Join(block, "\n") + "\n"
	}
	return w
}

// The README quotes every file of examples/walkthrough as it is, and only
// them; the programs import only the library's public packages, as a
// program in another module must.
func TestWalkthroughQuotesItsFiles(t *testing.T) {
	w := readWalkthrough(t)
	var onDisk []string
	require.NoError(t, filepath.WalkDir(walkthroughDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(walkthroughDir, path)
		switch {
		case strings.HasPrefix(rel, "mesh/identity/"), filepath.Base(rel) == ".gitignore", strings.HasSuffix(rel, ".token"):
			return nil // made at run time; the tokens are quoted in tokens.yaml
		}
		onDisk = append(onDisk, rel)
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, string(data), w.files[rel], "the README's %s", rel)
		return nil
	}))
	quoted := slices.Sorted(func(yield func(string) bool) {
		for k := range w.files {
			if !yield(k) {
				return
			}
		}
	})
	slices.Sort(onDisk)
	assert.Equal(t, onDisk, quoted, "the files the README quotes")
	for _, prog := range []string{"books", "web"} {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, "./"+filepath.Join(walkthroughDir, prog)).Output()
		require.NoError(t, err)
		for _, imp := range strings.Fields(string(out)) {
			first, _, _ := strings.Cut(imp, "/")
			if strings.Contains(first, ".") {
				assert.True(t, strings.HasPrefix(imp, "github.com/inmesh/inmesh/") && !strings.Contains(imp, "/internal") &&
					!strings.HasPrefix(imp, "github.com/inmesh/inmesh/examples"), "%s imports %s", prog, imp)
			}
		}
	}
}

var (
	walkthroughOnce sync.Once
	walkthroughErr  error
)

// buildWalkthrough compiles books and web beside the other examples.
func buildWalkthrough(t *testing.T) string {
	bin := build(t)
	walkthroughOnce.Do(func() {
		for _, name := range []string{"books", "web"} {
			out, err := exec.Command("go", "build", "-o", filepath.Join(bin, "walkthrough-"+name), filepath.Join(walkthroughDir, name)).CombinedOutput()
			if err != nil {
				walkthroughErr = fmt.Errorf("build %s: %w\n%s", name, err, out)
				return
			}
		}
	})
	require.NoError(t, walkthroughErr)
	return bin
}

// The walkthrough works as the README writes it, from a copy of its
// folder: the control plane with the README's arguments (its listeners on
// ports the kernel picks), books (on a port the kernel picks, which the
// copies of the endpoints file and of the Pod's containerPort then name),
// web, whose call reaches books over mTLS with web's identity; and the
// README's curl, from the same host without an identity, is refused 403,
// since books does not admit localhost as such.
func TestWalkthroughRuns(t *testing.T) {
	needCurl(t)
	bin := buildWalkthrough(t)
	w := readWalkthrough(t)
	dir := t.TempDir()
	for path, text := range w.files {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(path)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, path), []byte(text), 0o644))
	}
	for _, token := range []string{"books", "web"} {
		data, err := os.ReadFile(filepath.Join(walkthroughDir, "mesh", token+".token"))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "mesh", token+".token"), data, 0o600))
	}
	var dstAddr, idAddr, booksAddr string
	ran := 0
	for _, line := range w.commands {
		f := shellFields(line)
		switch {
		case len(f) == 2 && f[0] == "cd":
			continue // the copy's folder is the test's
		case len(f) >= 3 && f[0] == "go" && f[1] == "run" && f[2] == "../destination":
			args := append([]string(nil), f[3:]...)
			for i := 0; i+1 < len(args); i++ {
				if args[i] == "-listen" || args[i] == "-identity-listen" {
					args[i+1] = "127.0.0.1:0"
				}
			}
			args = append(args, "-interval", "100ms")
			dst := startIn(t, dir, filepath.Join(bin, "destination"), nil, args...)
			dstAddr, idAddr = dst.waitLog(t, dstAddrRe), dst.waitLog(t, identityAddrRe)
			ran++
		case len(f) == 3 && f[0] == "go" && f[1] == "run" && f[2] == "./books":
			books := startIn(t, dir, filepath.Join(bin, "walkthrough-books"), nil,
				"-listen", "127.0.0.1:0", "-control", dstAddr, "-identity", idAddr)
			booksAddr = books.waitLog(t, regexp.MustCompile(`books listening on (\S+)`))
			// The copies name the port the kernel gave books.
			port := booksAddr[strings.LastIndexByte(booksAddr, ':')+1:]
			for path, from := range map[string]string{"mesh/endpoints.yaml": "127.0.0.1:7000", "mesh/policies/books.yaml": "containerPort: 7000"} {
				to := strings.Replace(from, "7000", port, 1)
				require.Contains(t, w.files[path], from)
				require.NoError(t, os.WriteFile(filepath.Join(dir, path), []byte(strings.ReplaceAll(w.files[path], from, to)), 0o644))
			}
			ran++
		case len(f) == 3 && f[0] == "go" && f[1] == "run" && f[2] == "./web":
			// The policy reaches books once the control plane has loaded
			// the edited copies: web's call is admitted, whatever came
			// before.
			var out []byte
			require.Eventually(t, func() bool {
				cmd := exec.Command(filepath.Join(bin, "walkthrough-web"), "-control", dstAddr, "-identity", idAddr)
				cmd.Dir = dir
				var err error
				out, err = cmd.CombinedOutput()
				return err == nil && strings.HasPrefix(string(out), "200 OK")
			}, timeout, 100*time.Millisecond, "web's call: %s", out)
			assert.Equal(t, "200 OK: books, for web.default.serviceaccount.identity.linkerd.cluster.local\n", string(out))
			ran++
		case len(f) >= 2 && f[0] == "curl":
			args := append([]string{"-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"}, f[1:]...)
			for i := range args {
				args[i] = strings.ReplaceAll(args[i], "127.0.0.1:7000", booksAddr)
			}
			// Until books has its port's policy, the default one (all
			// unauthenticated) applies.
			code := 0
			for deadline := time.Now().Add(timeout); code != 403 && time.Now().Before(deadline); {
				out, _ := exec.Command("curl", args...).Output()
				if code, _ = strconv.Atoi(strings.TrimSpace(string(out))); code != 403 {
					time.Sleep(100 * time.Millisecond)
				}
			}
			assert.Equal(t, 403, code, line)
			ran++
		default:
			t.Fatalf("the walkthrough runs %q, which this test does not know", line)
		}
	}
	assert.Equal(t, 4, ran, "commands: %q", w.commands)

	// With the policy in force (curl refused), web is still admitted: by
	// its identity, not by where it connects from.
	cmd := exec.Command(filepath.Join(bin, "walkthrough-web"), "-control", dstAddr, "-identity", idAddr)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "200 OK: books, for web.default.serviceaccount.identity.linkerd.cluster.local\n", string(out))
}
