package ascend

import "syscall"

// threadID identifies the calling OS thread: a capture runs on a locked
// thread, and work issued from any other waits for it to end.
func threadID() int { return syscall.Gettid() }
