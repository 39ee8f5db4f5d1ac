package kernel

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// legacySSE matches the mnemonics of non-VEX SSE instructions on vector
// registers (MOVSS, ADDPS, PXOR, MOVQ X0, ...).
var legacySSE = regexp.MustCompile(`^(?:[A-UW-Z][A-Z0-9]*(?:SS|SD|PS|PD)|P(?:XOR|AND|OR|ADD|SUB|MUL|SHUF|MOV|UNPCK|CMP|SLL|SRL|SRA|MAX|MIN|BLEND|INSR|EXTR)[A-Z0-9]*|MOV[DQ]\s.*\bX\d+)\b`)

// TestAssemblyIsVEX checks that the assembly uses no legacy SSE encoding:
// one legacy instruction on an XMM register while the upper halves of the
// YMM registers are dirty cost this project's Zen 3 VM hundreds of cycles
// (KDARows, with a MOVSS per state row, ran 5x slower), and nothing else
// would catch it (the results are the same).
func TestAssemblyIsVEX(t *testing.T) {
	files, err := filepath.Glob("*.s")
	headers, _ := filepath.Glob("*.h") // macros the assembly includes
	files = append(files, headers...)
	if err != nil || len(files) == 0 {
		t.Fatalf("no assembly found: %v", err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			ins := strings.TrimSpace(line)
			if j := strings.Index(ins, "//"); j >= 0 {
				ins = strings.TrimSpace(ins[:j])
			}
			// A macro's line holds several instructions.
			for _, one := range strings.Split(strings.TrimSuffix(ins, "\\"), ";") {
				one = strings.TrimSpace(one)
				if strings.HasPrefix(one, "PREFETCH") {
					continue
				}
				if legacySSE.MatchString(one) {
					t.Errorf("%s:%d: legacy SSE instruction %q: use its VEX form", f, i+1, one)
				}
			}
		}
	}
}
