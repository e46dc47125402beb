package index

import "syscall"

// mapPopulate asks for the pages at once: one fault-free mapping instead
// of a page fault per page as a rebuild first writes them.
const mapPopulate = syscall.MAP_POPULATE
