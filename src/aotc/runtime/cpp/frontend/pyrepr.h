// Python's repr() of the values that runtime/signing.py and runtime/schema/fields.py put in
// their error messages, so that the C++ front end's signature errors read exactly as Python's:
// str and bytes literals, lists of str, and parsed JSON values (as json.loads gives them).
//
// Strings are UTF-8. Python keeps printable non-ASCII characters as they are and escapes
// unprintable ones; here the unprintable ones are those of Latin-1 and the common format and
// space characters (a short table, not Unicode's whole database), so a string of other
// unassigned or format characters may be shown unescaped where Python escapes it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "json.h"

namespace aotc::fe::py {

std::string repr(std::string_view text);          // str.__repr__ of UTF-8 text
std::string bytes_repr(std::string_view bytes);   // bytes.__repr__
std::string list_repr(const std::vector<std::string>& items);   // a list of str
std::string repr(const json::Value& v);
// fields.py short(): repr(v), cut to 80 characters and "..." where longer.
std::string short_repr(const json::Value& v);
// Characters (code points) of UTF-8 text, as len() of the Python str counts them.
size_t length(std::string_view text);

}  // namespace aotc::fe::py
