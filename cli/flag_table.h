// A command's flags as data: one row per flag, naming the field its value
// goes to (a field of the library's options where one exists, such as
// TrainOptions::parallel.tp, or of the command's own flags), its help and its
// check. add_flags registers a table with CLI11, in the table's order.
//
//   const FlagTable<TrainFlags> rows = {
//       {"--tp", FLAG_FIELD(TrainFlags, opts.parallel.tp), "Tensor-parallel degree", degree, kShowDefault},
//   };
//   add_flags(sub, flags, rows);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>

namespace shardlab::cli {

// Where a flag's value goes. A bool is a flag without a value.
using FlagField = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::optional<int>*,
                               std::optional<double>*, std::vector<std::string>*, std::vector<int>*>;

inline constexpr bool kShowDefault = true;  // FlagRow::show_default: "[default]" in --help

template <class Flags>
struct FlagRow {
  std::string names;                    // "--tp", or "--ffn,--ffn-hidden-size"
  FlagField (*field)(Flags&);           // the field it sets
  std::string help;
  std::optional<CLI::Validator> check;  // run by CLI11 while parsing
  bool show_default = false;
  bool hidden = false;    // left out of --help (testing aids)
  bool take_all = false;  // a repeatable flag keeps every occurrence's values
  bool required = false;  // the command needs it
};

template <class Flags>
using FlagTable = std::vector<FlagRow<Flags>>;

// A number flag's text held to runtime/parse_number.h's rule before CLI11
// converts it (CLI11 alone takes "+5", " 5" and "0x10"): "\"x\" is not a
// number", "inf is not a finite number", "2.5 is not an integer" (cli.cc).
CLI::Validator number_text(bool integer);

// The field a row sets: FLAG_FIELD(TrainFlags, opts.parallel.tp).
#define FLAG_FIELD(Flags, path) [](Flags& f) -> ::shardlab::cli::FlagField { return &f.path; }

template <class Flags>
void add_flags(CLI::App* sub, Flags& flags, const FlagTable<Flags>& table) {
  for (const FlagRow<Flags>& row : table) {
    CLI::Option* o = std::visit(
        [&](auto* field) -> CLI::Option* {
          // A flag takes no value: `--sp=2` is one error line, not "on".
          if constexpr (std::is_same_v<decltype(field), bool*>)
            return sub->add_flag(row.names, *field, row.help)->disable_flag_override();
          else return sub->add_option(row.names, *field, row.help);
        },
        row.field(flags));
    std::visit(
        [&](auto* field) {
          using Field = std::remove_pointer_t<decltype(field)>;
          if constexpr (std::is_same_v<Field, int> || std::is_same_v<Field, int64_t> ||
                        std::is_same_v<Field, uint64_t> || std::is_same_v<Field, std::optional<int>> ||
                        std::is_same_v<Field, std::vector<int>>)
            o->check(number_text(true));
          else if constexpr (std::is_same_v<Field, double> || std::is_same_v<Field, std::optional<double>>)
            o->check(number_text(false));
        },
        row.field(flags));
    if (row.show_default) o->capture_default_str();
    if (row.check) o->check(*row.check);
    if (row.take_all) o->take_all();
    if (row.required) o->required();
    if (row.hidden) o->group("");
  }
}

}  // namespace shardlab::cli
