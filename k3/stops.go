package k3

// stopMatcher follows a generation's text for its stop strings as the
// text arrives: per string, the length of the longest suffix of the text
// so far that begins it (the state of its Knuth-Morris-Pratt automaton).
// Each byte of text advances every string's state in amortised constant
// time, so the text held back for a stop string that may be starting
// costs nothing per token, however long the strings (looking for each
// prefix of each string at the end of the text took time that grew as
// the square of a long string's length, every token).
type stopMatcher struct {
	stops []string
	fail  [][]int32 // fail[i][k]: the longest proper border of stops[i][:k+1]
	state []int
}

func newStopMatcher(stops []string) *stopMatcher {
	m := &stopMatcher{stops: stops, fail: make([][]int32, len(stops)), state: make([]int, len(stops))}
	for i, s := range stops {
		f := make([]int32, len(s))
		k := 0
		for j := 1; j < len(s); j++ {
			for k > 0 && s[j] != s[k] {
				k = int(f[k-1])
			}
			if s[j] == s[k] {
				k++
			}
			f[j] = int32(k)
		}
		m.fail[i] = f
	}
	return m
}

// feed advances over text and reports whether a stop string ended in it.
func (m *stopMatcher) feed(text string) bool {
	found := false
	for i, s := range m.stops {
		k, f := m.state[i], m.fail[i]
		for j := 0; j < len(text); j++ {
			if k == len(s) {
				k = int(f[k-1])
			}
			for k > 0 && text[j] != s[k] {
				k = int(f[k-1])
			}
			if text[j] == s[k] {
				k++
			}
			if k == len(s) {
				found = true
			}
		}
		m.state[i] = k
	}
	return found
}

// pending returns how many bytes at the end of the text so far may begin
// a stop string, once feed has reported that none ended there.
func (m *stopMatcher) pending() int {
	n := 0
	for _, k := range m.state {
		n = max(n, k)
	}
	return n
}
