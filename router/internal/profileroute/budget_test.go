package profileroute

import (
	"testing"
	"time"

	"github.com/inmesh/inmesh/profiles"
	"github.com/stretchr/testify/assert"
)

func TestKeepBudget(t *testing.T) {
	mk := func(b profiles.RetryBudget) *tableState { return &tableState{budget: &budgetCell{conf: b}} }
	prev := mk(profiles.DefaultRetryBudget())
	same := mk(profiles.DefaultRetryBudget())
	keepBudget(prev, same)
	assert.Same(t, prev.budget, same.budget, "unchanged parameters keep the state")

	changed := profiles.DefaultRetryBudget()
	changed.TTL = 5 * time.Second
	other := mk(changed)
	fresh := other.budget
	keepBudget(prev, other)
	assert.Same(t, fresh, other.budget, "new parameters start afresh")

	none := &tableState{}
	keepBudget(prev, none)
	assert.Nil(t, none.budget, "no budget stays none")
	keepBudget(nil, same)
	keepBudget(&tableState{}, same)
}
