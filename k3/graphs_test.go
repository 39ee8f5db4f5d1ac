package k3

import "testing"

func TestGraphBucket(t *testing.T) {
	for _, c := range []struct{ rows, room, want int }{
		{1, 8, 1}, {2, 8, 2}, {3, 8, 4}, {4, 4, 4}, {3, 3, 3}, {5, 8, 8}, {5, 7, 5}, {9, 16, 16}, {16, 100, 16},
	} {
		if got := graphBucket(c.rows, c.room); got != c.want {
			t.Errorf("graphBucket(%d, %d) = %d, want %d", c.rows, c.room, got, c.want)
		}
	}
}
