package recache

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCompileReturnsTheSameValueForAPattern(t *testing.T) {
	a, err := Compile(`^/books/[^/]+$`)
	require.NoError(t, err)
	b, err := Compile(`^/books/[^/]+$`)
	require.NoError(t, err)
	assert.Same(t, a, b, "the second compile of a pattern must reuse the first")
	assert.True(t, a.MatchString("/books/1"))
	assert.False(t, a.MatchString("/books/1/x"))

	c, err := Compile(`^/authors/[^/]+$`)
	require.NoError(t, err)
	assert.NotSame(t, a, c)
	assert.False(t, c.MatchString("/books/1"))
}

func TestCompileRefusesABadPatternEveryTime(t *testing.T) {
	for range 2 {
		re, err := Compile(`/books/(`)
		require.Error(t, err)
		assert.Nil(t, re)
	}
}

func TestCompileIsBounded(t *testing.T) {
	for i := range MaxEntries + 500 {
		_, err := Compile(fmt.Sprintf("^/bound/%d$", i))
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, regexps.Len(), MaxEntries)
	// A pattern evicted or not, the value is correct.
	re, err := Compile("^/bound/7$")
	require.NoError(t, err)
	assert.True(t, re.MatchString("/bound/7"))
}

func TestCompileConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	got := make([]any, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			re, err := Compile(`^/concurrent/\d+$`)
			if err == nil {
				got[i] = re
			}
		}()
	}
	wg.Wait()
	for _, re := range got[1:] {
		assert.Same(t, got[0], re, "every caller gets the one kept value")
	}
}
