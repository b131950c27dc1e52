package destination

import (
	"slices"
	"testing"

	"github.com/inmesh/inmesh/internal/mailbox"
	"github.com/stretchr/testify/assert"
)

// TestSubList checks a watch's list of mailboxes as subscribers come and
// go in any order.
func TestSubList(t *testing.T) {
	tests := []struct {
		name   string
		add    int
		remove []int // indexes of the added mailboxes, in order
		want   []int // indexes left, in any order
	}{
		{name: "empty", want: nil},
		{name: "one", add: 1, want: []int{0}},
		{name: "one removed", add: 1, remove: []int{0}, want: nil},
		{name: "two, first removed", add: 2, remove: []int{0}, want: []int{1}},
		{name: "two, second removed", add: 2, remove: []int{1}, want: []int{0}},
		{name: "three, middle removed", add: 3, remove: []int{1}, want: []int{0, 2}},
		{name: "three, all removed", add: 3, remove: []int{2, 0, 1}, want: nil},
		{name: "four, first twice", add: 4, remove: []int{0, 0, 3}, want: []int{1, 2}},
		{name: "not there", add: 2, remove: []int{0, 0}, want: []int{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			boxes := make([]*mailbox.Mailbox[int], tt.add)
			var l subList[int]
			for i := range boxes {
				boxes[i] = new(mailbox.Mailbox[int])
				l.add(boxes[i])
			}
			for _, i := range tt.remove {
				l.remove(boxes[i])
			}
			var got []int
			for s := range l.all() {
				got = append(got, slices.Index(boxes, s))
			}
			slices.Sort(got)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, len(tt.want), l.len())
			if len(tt.want) == 0 {
				assert.Equal(t, subList[int]{}, l, "an emptied list keeps nothing")
			}
		})
	}
}
