package e2e

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// readmeCommands returns the commands of the README's sh blocks, with
// backslash continuations joined.
func readmeCommands(t *testing.T) []string {
	data, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	var cmds []string
	in := false
	cur := ""
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
			continue
		case strings.HasPrefix(line, "```"):
			in = false
			continue
		case !in:
			continue
		}
		line = strings.TrimSpace(line)
		if i := strings.Index(line, "  #"); i >= 0 {
			line = strings.TrimSpace(line[:i]) // a trailing comment
		}
		if strings.HasSuffix(line, `\`) {
			cur += strings.TrimSuffix(line, `\`)
			continue
		}
		if line = strings.TrimSpace(cur + line); line != "" {
			cmds = append(cmds, line)
		}
		cur = ""
	}
	return cmds
}

// shellFields splits a command line as sh does for the README's commands:
// words, and single-quoted strings.
func shellFields(s string) []string {
	var out []string
	var cur strings.Builder
	quoted, inWord := false, false
	for _, r := range s {
		switch {
		case r == '\'':
			quoted, inWord = !quoted, true
		case r == ' ' && !quoted:
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

// The listeners of the README's programs, and the log line in which each
// program names the address the kernel gave it.
var readmeListeners = map[string]map[string]*regexp.Regexp{
	"app":         {"-listen": regexp.MustCompile(`listening on (\S+)`)},
	"destination": {"-listen": dstAddrRe, "-identity-listen": identityAddrRe},
	"proxy":       {"-outbound": listenRe("outbound"), "-inbound": listenRe("inbound"), "-metrics": listenRe("metrics")},
}

// Every command the README shows works as written: the demo of the quick
// start exits 0 with its tables, and the programs of "Running the examples"
// start with the README's arguments (each listener on a port the kernel
// picks instead of the README's fixed one, and the addresses that refer to
// it, the endpoints file's among them, changed to match) and answer the
// README's curl commands.
func TestReadmeCommands(t *testing.T) {
	needCurl(t)
	bin := build(t)
	cmds := readmeCommands(t)
	require.NotEmpty(t, cmds)
	addrs := map[string]string{} // the README's address -> the one the kernel gave
	substitute := func(s string) string {
		for from, to := range addrs {
			s = strings.ReplaceAll(s, from, to)
		}
		return s
	}
	var endpointsCopy, endpointsOrig string
	ran := 0
	for _, line := range cmds {
		f := shellFields(line)
		switch {
		case len(f) >= 2 && f[0] == "go" && f[1] == "test":
			continue // the test command itself: this run
		case len(f) >= 3 && f[0] == "go" && f[1] == "run" && f[2] == "./examples/mesh":
			out, err := exec.Command(filepath.Join(bin, "mesh"), f[3:]...).CombinedOutput()
			require.NoError(t, err, "%s\n%s", line, out)
			assert.Contains(t, string(out), "books (ServiceProfile routes)", line)
			ran++
		case len(f) >= 3 && f[0] == "go" && f[1] == "run" && strings.HasPrefix(f[2], "./examples/"):
			prog := strings.TrimPrefix(f[2], "./examples/")
			listeners, known := readmeListeners[prog]
			require.True(t, known, "the README runs %s, which this test does not know how to watch", prog)
			args := append([]string(nil), f[3:]...)
			var mine []string
			for i := 0; i+1 < len(args); i++ {
				switch {
				case listeners[args[i]] != nil:
					mine = append(mine, args[i], args[i+1])
					args[i+1] = "127.0.0.1:0"
					i++
				case args[i] == "-endpoints":
					// A copy whose addresses follow the listeners'.
					endpointsOrig = filepath.Join("../..", args[i+1])
					endpointsCopy = filepath.Join(t.TempDir(), "endpoints.yaml")
					data, err := os.ReadFile(endpointsOrig)
					require.NoError(t, err)
					require.NoError(t, os.WriteFile(endpointsCopy, []byte(substitute(string(data))), 0o644))
					args[i+1] = endpointsCopy
					i++
				default:
					args[i+1] = substitute(args[i+1])
					// Paths are relative to the repository's root.
					if _, err := os.Stat(filepath.Join("../..", args[i+1])); err == nil && !strings.HasPrefix(args[i+1], "-") {
						args[i+1] = filepath.Join("../..", args[i+1])
					}
				}
			}
			p := start(t, filepath.Join(bin, prog), nil, args...)
			for i := 0; i < len(mine); i += 2 {
				addrs[mine[i+1]] = p.waitLog(t, listeners[mine[i]])
			}
			if endpointsCopy != "" {
				data, err := os.ReadFile(endpointsOrig)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(endpointsCopy, []byte(substitute(string(data))), 0o644))
			}
			ran++
		case len(f) >= 1 && f[0] == "curl":
			args := append([]string{"-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}"}, f[1:]...)
			for i := range args {
				args[i] = substitute(args[i])
			}
			// A stream (curl -N, the tap) stays open: it is good when it
			// answers 200 and is still open when curl stops waiting.
			stream := slices.Contains(f, "-N")
			if stream {
				args[2] = "2"
			}
			var code int
			require.Eventually(t, func() bool {
				out, err := exec.Command("curl", args...).Output()
				code, _ = strconv.Atoi(strings.TrimSpace(string(out)))
				var exit *exec.ExitError
				if stream && errors.As(err, &exit) && exit.ExitCode() == 28 { // curl: operation timed out
					err = nil
				}
				return err == nil && code == 200
			}, timeout, 100*time.Millisecond, "%s (last status %d)", line, code)
			ran++
		}
	}
	t.Logf("ran %d of the README's commands", ran)
	assert.GreaterOrEqual(t, ran, 6, fmt.Sprintf("commands: %q", cmds))
}
