package profiles

import (
	"testing"

	"github.com/inmesh/inmesh/internal/recache"

	"github.com/stretchr/testify/assert"
)

func TestFastPathShapes(t *testing.T) {
	for pattern, fast := range map[string]bool{
		`/pkg\.Service/Method`: true, `/books/[^/]+`: true, `/api/.*`: true, `^/api/.*$`: true, ` /x `: true,
		`/books/[^/]*`: false, `(?i)/api`: false, `/a|/b`: false, `/x/[0-9]+`: false, `/a/.*/b`: false, `/(a)`: false,
	} {
		assert.Equal(t, fast, fastPath(pattern) != nil, pattern)
	}
}

// FuzzFastPath checks that the fast matchers agree with the regexp engine.
func FuzzFastPath(f *testing.F) {
	for _, s := range [][2]string{
		{`/books/[^/]+`, "/books/1"}, {`/books/[^/]+`, "/books/"}, {`/books/[^/]+`, "/books/1/2"},
		{`/api/.*`, "/api/\n"}, {`/api/.*`, "/api"}, {`/pkg\.S/M`, "/pkg.S/M"}, {`^/x$`, "/x"}, {`/é/[^/]+`, "/é/ü"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pattern, path string) {
		re, err := recache.CompileAnchored(pattern)
		fast := fastPath(pattern)
		if err != nil || fast == nil {
			return // Compile rejects it, or it takes the regexp engine
		}
		if got, want := fast(path), re.MatchString(path); got != want {
			t.Fatalf("pattern %q path %q: fast %v, regexp %v", pattern, path, got, want)
		}
	})
}
