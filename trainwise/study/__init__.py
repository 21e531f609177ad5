"""A study: validate and prepare once (`prepare`), then one trial per (strategy row, repeat) run and stored as
it ends (`run`), aggregated into the table and its reports (`aggregate`). `store` owns every file a study
writes and reads. Import the module you need (`from trainwise.study.run import run_study`): this package
imports none of them, so reading a study's files never loads what training needs."""
